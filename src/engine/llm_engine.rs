//! LlmEngine: the synchronous engine core. `step()` is schedule → run →
//! postprocess: the scheduler picks the step's work, the model runner computes
//! it in one submission, and postprocessing appends tokens, applies stop
//! conditions, frees finished sequences' blocks, records metrics and produces
//! incremental outputs. `Engine` (engine.rs) runs it on its own thread.

use std::sync::Arc;
use std::time::Instant;

use super::LoadTimings;
use super::config::{EngineConfig, KvPlan};
use super::guided;
use super::model_runner::{ModelRunner, SeqChunk, StepRunner};
use super::output::{RequestMetrics, RequestOutput};
use super::postprocess::{postprocess_token, request_metrics};
use super::request::{Prompt, tokenize_prompt, validate_request};
use super::scheduler::{Scheduler, SchedulerConfig};
use super::sequence::{FinishReason, SeqId, SeqStatus, Sequence};
use super::step_budget::StepBudget;
use super::{BlockManager, DraftModel, EngineError, KvCache, KvGroups, MemoryInputs, MemoryPlan};
use crate::backend::wgsl::Kernels;
use crate::backend::{Backend, OpenBackend};
use crate::gpu::GpuContext;
use crate::metrics::Metrics;
use crate::model::{DecoderModel, ModelConfig, ModelFiles};
use crate::sampling::SamplingParams;
use crate::sampling::constraint::Guide;
use crate::tokenizer::Tokenizer;

/// The most logits rows (one a sampling sequence) a step can hold for a
/// vocabulary of `vocab`: the rows must bind as one buffer of at most `max_buffer` bytes.
pub fn max_logits_rows(vocab: usize, max_buffer: u64) -> usize {
    (max_buffer / (vocab.max(1) as u64 * 4)).max(1) as usize
}

/// The engine core.
pub struct LlmEngine {
    pub tokenizer: Arc<Tokenizer>,
    /// Structured output's token trie and parser factory (built on first use).
    pub guide: Arc<Guide>,
    pub model_config: ModelConfig,
    pub plan: KvPlan,
    /// Weights / step buffers / KV pool of the adapter's memory, planned at start.
    pub memory: MemoryPlan,
    pub runner: Box<dyn StepRunner>,
    pub scheduler: Scheduler,
    /// Each step's token budget, from the measured cost of the steps so far.
    pub budget: StepBudget,
    pub metrics: Metrics,
    next_id: SeqId,
    static_bytes: u64,
    /// Where the load's time went.
    pub load_timings: LoadTimings,
    /// The step trace (`EngineConfig::trace_steps` > 0).
    pub trace: Option<crate::trace::TraceRecorder>,
    /// The model file's name (for traces and pages).
    pub model_name: String,
    /// The row tile the warm-up chose for batched gemms, with its timings.
    pub row_tile: Option<super::RowTileChoice>,
    /// Speculative decoding of greedy requests (`EngineConfig::speculative`).
    pub speculative: Option<crate::config::SpeculativeConfig>,
    /// The draft model of `draft_model` speculation.
    pub draft: Option<DraftModel>,
}

impl LlmEngine {
    /// Opens the device (`cfg.device`), loads the model and tokenizer, sizes the KV pool.
    pub fn new(cfg: &EngineConfig) -> Result<Self, EngineError> {
        let (backend, opened) = crate::backend::open(cfg)?;
        let mut me = match backend {
            OpenBackend::Wgpu(k) => Self::with_backend(*k, cfg)?,
            #[cfg(feature = "cuda")]
            OpenBackend::Cuda(c) => Self::with_backend(c, cfg)?,
        };
        let t = &mut me.load_timings;
        t.device = opened.seconds - opened.compile_seconds;
        t.pipelines += opened.compile_seconds;
        t.total += opened.seconds;
        Ok(me)
    }

    /// Bytes the engine holds on the device besides the KV pool: weights
    /// (with rope tables) and step buffers, as allocated.
    pub fn static_bytes(&self) -> u64 {
        self.static_bytes
    }

    /// The memory plan for a model on `kernels`' device, before anything is
    /// loaded: weights and step buffers counted at their largest (the context
    /// `cfg.max_model_len` or the model's), the KV pool what that leaves.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_memory(
        device: Option<crate::gpu::DeviceMemory>,
        cpu_adapter: bool,
        narrow_weights: bool,
        files: &ModelFiles,
        model_config: &ModelConfig,
        kv_groups: usize,
        cfg: &EngineConfig,
        draft: Option<(&ModelFiles, &ModelConfig)>,
    ) -> Result<MemoryPlan, EngineError> {
        let context = cfg
            .max_model_len
            .unwrap_or(model_config.max_context)
            .min(model_config.max_context);
        let mut weights = super::memory_plan::weight_bytes(files, model_config, context, narrow_weights);
        let mut activations = super::memory_plan::step_buffer_bytes(
            model_config,
            cfg.max_num_batched_tokens,
            cfg.max_num_seqs,
            context.div_ceil(cfg.block_size.max(1)),
            kv_groups,
        );
        // A draft model's weights and step buffers; its pool shares the KV
        // bytes with the target's in proportion to their bytes a token.
        let mut kv_per_token = model_config.kv_bytes_per_token(cfg.kv_dtype()) as u64;
        if let Some((f, c)) = draft {
            weights += super::memory_plan::weight_bytes(f, c, context.min(c.max_context), narrow_weights);
            activations += super::memory_plan::step_buffer_bytes(
                c,
                cfg.max_num_batched_tokens,
                cfg.max_num_seqs,
                context.div_ceil(cfg.block_size.max(1)),
                1,
            );
            kv_per_token += c.kv_bytes_per_token(cfg.kv_dtype()) as u64;
        }
        let inputs = MemoryInputs {
            device,
            cpu_adapter,
            kv_cache_memory: cfg.kv_cache_memory,
            gpu_memory_utilization: cfg.gpu_memory_utilization,
            kv_useful: (cfg.max_num_seqs * context) as u64 * kv_per_token,
        };
        MemoryPlan::new(weights, activations, &inputs).map_err(EngineError::Config)
    }

    /// As `new`, on an already opened wgpu device (engines on one device share its pipelines).
    pub fn with_context(ctx: &GpuContext, cfg: &EngineConfig) -> Result<Self, EngineError> {
        Self::with_backend(Kernels::with_tiles(ctx, cfg.gemm_tiles)?, cfg)
    }

    /// As `new`, on a backend the caller opened.
    pub fn with_backend<B: Backend>(kernels: B, cfg: &EngineConfig) -> Result<Self, EngineError> {
        let t0 = Instant::now();
        let mut timings = LoadTimings::default();
        let compiled_before = kernels.pipeline_stats().compile_seconds;
        if let Some(s) = &cfg.speculative {
            s.check().map_err(EngineError::Config)?;
        }
        let files = ModelFiles::open_with(&cfg.model, cfg.quantize)?;
        let model_config = files.config()?;
        let tokenizer = match &files {
            ModelFiles::Gguf { file, .. } => Tokenizer::from_gguf(file)?,
            ModelFiles::Hf { dir, .. } => Tokenizer::from_hf_dir(dir)?,
        };
        let dtype = cfg.kv_dtype();
        // A head's K and V are whole q8_0 blocks (as llama.cpp asks of a
        // quantised cache): a block never spans two heads, which the q8_0
        // keys' rotation needs.
        if !model_config.head_dim.is_multiple_of(dtype.row_multiple() as usize) {
            return Err(EngineError::Config(format!(
                "--kv-cache-dtype {dtype} holds each head's K and V in whole blocks of {} values; this \
                 model's heads have {}: use --kv-cache-dtype f16",
                dtype.row_multiple(),
                model_config.head_dim
            )));
        }
        let kv_groups = KvGroups::of(&model_config, cfg.hybrid_kv_cache);
        let draft_files = match cfg.speculative.as_ref().and_then(|s| s.model.as_deref()) {
            Some(path) => Some(DraftModel::open(path, &tokenizer)?),
            None => None,
        };
        let mut memory = Self::plan_memory(
            kernels.device_memory(),
            kernels.shares_host_memory(),
            kernels.reads_narrow_weights(),
            &files,
            &model_config,
            kv_groups.len(),
            cfg,
            draft_files.as_ref().map(|(f, c)| (f, c)),
        )?;
        // The draft's share of the pool's bytes.
        let draft_kv = draft_files.as_ref().map_or(0, |(_, c)| {
            let (t, d) = (
                model_config.kv_bytes_per_token(cfg.kv_dtype()) as u64,
                c.kv_bytes_per_token(cfg.kv_dtype()) as u64,
            );
            (memory.kv as u128 * d as u128 / (t + d) as u128) as u64
        });
        let plan = KvPlan::new(
            &kv_groups,
            cfg.kv_dtype(),
            model_config.kv_bytes_per_token(cfg.kv_dtype()),
            cfg.block_size,
            cfg.max_num_batched_tokens,
            Some(memory.kv - draft_kv),
            kernels.max_buffer(),
            model_config.max_context,
            cfg.max_model_len,
        )
        .map_err(EngineError::Config)?;
        // Whole blocks, within the binding limit: what the pool really takes
        // (the draft's counted once it is loaded).
        memory.kv = plan.pool_bytes;
        if cfg.max_num_batched_tokens == 0 || cfg.max_num_seqs == 0 {
            return Err(EngineError::Config(
                "--max-num-batched-tokens and --max-num-seqs must be at least 1".into(),
            ));
        }
        let max_rows = max_logits_rows(model_config.vocab, kernels.max_buffer());
        if cfg.max_num_seqs > max_rows {
            return Err(EngineError::Config(format!(
                "--max-num-seqs {} needs a logits row of {} floats for each sequence ({} bytes), over the \
                 adapter's binding limit of {} bytes: use --max-num-seqs {max_rows} or fewer",
                cfg.max_num_seqs,
                model_config.vocab,
                cfg.max_num_seqs as u64 * model_config.vocab as u64 * 4,
                kernels.max_buffer()
            )));
        }
        timings.tokenizer = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        // Rope tables for the positions this engine can reach, not the model's whole context.
        let mut load_config = model_config.clone();
        load_config.max_context = load_config.max_context.min(plan.max_model_len.max(1));
        let model = DecoderModel::load(&kernels, &files, &load_config)?;
        let draft = match (&draft_files, cfg.speculative.as_ref().and_then(|s| s.model.as_deref())) {
            (Some((f, c)), Some(path)) => {
                let load = super::draft_model::DraftLoad {
                    files: f,
                    config: c,
                    kv_bytes: draft_kv,
                    dtype: cfg.kv_dtype(),
                    block_size: cfg.block_size,
                    max_tokens: cfg.max_num_batched_tokens,
                    max_seqs: cfg.max_num_seqs,
                    max_model_len: plan.max_model_len,
                    max_binding: kernels.max_buffer(),
                };
                let name = path
                    .file_name()
                    .map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into());
                let sibling = kernels
                    .sibling()
                    .map_err(|e| EngineError::Config(format!("draft model: {}", e.into())))?;
                Some(DraftModel::load(sibling, &load, model_config.vocab, name)?)
            }
            _ => None,
        };
        timings.weights = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let kv = KvCache::new(
            &kernels,
            &model.cfg,
            kv_groups.clone(),
            cfg.kv_dtype(),
            plan.num_blocks,
            plan.block_size,
        )?;
        // A device that could not hold the weights or the pool (other
        // programs' memory, a driver's budget) said so as it allocated them.
        if let Some(e) = kernels.take_device_error() {
            let e: crate::backend::BackendError = e.into();
            return Err(EngineError::Config(format!(
                "loading the model: {e} (the plan: {})",
                memory.describe()
            )));
        }
        let runner = ModelRunner::new(
            kernels,
            model,
            kv,
            cfg.max_num_batched_tokens,
            cfg.max_num_seqs,
            plan.max_model_len,
        )?;
        timings.kv_pool = t2.elapsed().as_secs_f64();
        timings.pipeline_stats = runner.pipeline_stats();
        timings.pipelines = timings.pipeline_stats.compile_seconds - compiled_before;
        timings.total = t0.elapsed().as_secs_f64();
        let sched_cfg = SchedulerConfig {
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            max_model_len: plan.max_model_len,
        };
        let blocks = BlockManager::with_groups(
            plan.num_blocks,
            plan.block_size,
            cfg.enable_prefix_caching,
            kv_groups.windows.clone(),
        );
        let static_bytes = runner.static_bytes();
        let tokenizer = Arc::new(tokenizer);
        let trace = (cfg.trace_steps > 0)
            .then(|| crate::trace::TraceRecorder::new(cfg.trace_steps, plan.num_blocks, plan.block_size));
        let mut me = Self {
            guide: Arc::new(Guide::new(tokenizer.clone())),
            tokenizer,
            model_config,
            plan,
            memory,
            scheduler: Scheduler::new(sched_cfg, blocks),
            budget: StepBudget::new(cfg.step_target),
            runner: Box::new(runner),
            metrics: Metrics::default(),
            next_id: 0,
            static_bytes,
            load_timings: timings,
            trace,
            model_name: cfg
                .model
                .file_name()
                .map_or_else(|| cfg.model.display().to_string(), |f| f.to_string_lossy().into()),
            row_tile: None,
            speculative: cfg.speculative.clone(),
            draft,
        };
        // Until a warm-up times the row-tile caps (`warm_up`: servers), batched
        // gemms take the smallest: its pipelines compile in a third of the
        // time of the largest's on llvmpipe, where an engine without warm-up
        // (`wllm generate`, `chat`, `embed`) compiles them in its first
        // prompt. Every tile gives the same bits.
        if let Some(&smallest) = me.runner.row_tile_caps().last() {
            me.runner.set_row_tile_cap(smallest);
        }
        if let Some(d) = &me.draft {
            me.memory.kv += d.kv_bytes();
        }
        me.metrics.cache_config = crate::metrics::CacheConfig {
            cache_dtype: me.plan.dtype.to_string(),
            block_size: me.plan.block_size,
            num_gpu_blocks: me.plan.num_blocks,
            bytes_per_token: me.plan.bytes_per_token,
            pool_bytes: me.runner.kv_bytes(),
            weight_bytes: me.runner.weight_bytes(),
            step_buffer_bytes: me.static_bytes - me.runner.weight_bytes(),
            device_memory_bytes: me.memory.device.map_or(0, |d| d.total),
        };
        me.update_gauges();
        Ok(me)
    }

    /// Token ids of a prompt.
    pub fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        tokenize_prompt(&self.tokenizer, prompt, self.plan.max_model_len)
    }

    /// Checks a request against the model and the pool; returns the total-token cap.
    pub fn validate(&self, prompt: &[u32], params: &SamplingParams) -> Result<usize, EngineError> {
        validate_request(prompt, params, self.model_config.vocab, self.plan.max_model_len)
    }

    /// Queues a tokenised request.
    pub fn add_request(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<SeqId, EngineError> {
        let id = self.next_id;
        self.add_request_with_id(id, prompt, params)?;
        Ok(id)
    }

    /// Queues a tokenised request under an id the caller chose (unique, never reused).
    pub fn add_request_with_id(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<(), EngineError> {
        self.add_request_in_group(id, prompt, params, id)
    }

    /// As `add_request_with_id`, in a group of sequences the scheduler admits
    /// in turn with other groups (see `Scheduler::schedule_within`).
    pub fn add_request_in_group(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        params: SamplingParams,
        group: SeqId,
    ) -> Result<(), EngineError> {
        self.add_request_arrived(id, prompt, params, group, Instant::now())
    }

    /// As `add_request_in_group`, for a request that arrived at `arrival`
    /// (its metrics count from there): the engine handle's, whose requests
    /// wait in a channel while a step runs.
    pub fn add_request_arrived(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        params: impl Into<Arc<SamplingParams>>,
        group: SeqId,
        arrival: Instant,
    ) -> Result<(), EngineError> {
        self.add_sequence(id, prompt, params.into(), 0, group, arrival, None)
    }

    /// As `add_request_arrived`, for the sequence at `seed_offset` of a
    /// request whose sequences share `params`, with the structured-output
    /// matcher compiled off the engine thread (`matcher`; `None`: compiled
    /// here from `params.constraint`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_sequence(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        params: Arc<SamplingParams>,
        seed_offset: u64,
        group: SeqId,
        arrival: Instant,
        matcher: Option<Box<crate::sampling::constraint::Matcher>>,
    ) -> Result<(), EngineError> {
        let max_total = self.validate(&prompt, &params)?;
        if self.scheduler.seqs.contains_key(&id) {
            return Err(EngineError::InvalidRequest(format!(
                "request id {id} is already in use"
            )));
        }
        self.next_id = self.next_id.max(id + 1);
        let matcher = match (&params.constraint, matcher) {
            (_, Some(m)) => Some(m),
            (Some(c), None) => Some(Box::new(
                self.guide
                    .matcher(c, self.model_config.vocab)
                    .map_err(|e| EngineError::InvalidRequest(e.to_string()))?,
            )),
            (None, None) => None,
        };
        let spec_cfg =
            crate::config::RequestSpeculation::resolve(params.speculative_config.as_ref(), self.speculative.as_ref())
                .map_err(|e| EngineError::Params(crate::sampling::InvalidParams("speculative_config", e)))?;
        let mut seq = Sequence::seeded(id, prompt, params, seed_offset, max_total);
        seq.spec_cfg = spec_cfg.filter(|_| seq.params.speculates() && seq.pooler.is_none());
        seq.group = group;
        seq.matcher = matcher;
        seq.times.arrival = arrival.min(seq.times.arrival);
        if let Some(t) = &mut self.trace {
            t.arrived(id, seq.prompt_len, seq.times.arrival);
        }
        self.scheduler.add(seq);
        Ok(())
    }

    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    /// Aborts a request, freeing its blocks now.
    pub fn abort(&mut self, id: SeqId) -> Option<RequestOutput> {
        let mut seq = self.scheduler.finish(id)?;
        seq.status = SeqStatus::Finished(FinishReason::Abort);
        if let Some(t) = &mut self.trace {
            t.finished(id, FinishReason::Abort.as_str(), Instant::now());
        }
        self.update_gauges();
        Some(RequestOutput {
            id,
            finish_reason: Some(FinishReason::Abort),
            num_prompt_tokens: seq.prompt_len,
            metrics: Some(request_metrics(&seq, Instant::now())),
            ..Default::default()
        })
    }

    /// Runs one step and returns the outputs it produced.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let tokens = self.budget.max_tokens(
            self.scheduler.decode_rows(),
            self.scheduler.live(),
            self.plan.block_size,
            self.scheduler.cfg.max_num_batched_tokens,
        );
        let decodes = self.scheduler.decode_rows();
        let fit = self.budget.cost.fit();
        let row_cost = super::speculative::row_cost(fit, decodes);
        let draft_cost = super::speculative::draft_cost(fit, decodes, self.draft.as_ref().and_then(|d| d.round_ms));
        super::speculative::draft(&mut self.scheduler, row_cost, draft_cost, self.draft.as_mut())?;
        let mut plan = self.scheduler.schedule_within(tokens);
        super::speculative::settle(&mut self.scheduler, &mut plan);
        self.metrics.num_preemptions_total = self.scheduler.num_preemptions;
        self.metrics.prefix_cache_queries_total = self.scheduler.prefix_queries;
        self.metrics.prefix_cache_hits_total = self.scheduler.prefix_hits;
        if plan.is_empty() {
            self.update_gauges();
            return Ok(Vec::new());
        }
        // Structured output: the matchers of sequences that sample this step
        // compute their masks on another thread while the step runs.
        let mut guided: Vec<(SeqId, Box<llguidance::Matcher>)> = plan
            .scheduled
            .iter()
            .filter_map(|&(id, n)| {
                let s = self.scheduler.seqs.get_mut(&id)?;
                if s.num_computed_tokens + n != s.num_tokens() {
                    return None;
                }
                Some((id, s.matcher.take()?))
            })
            .collect();
        let mut want_logits = false;
        let chunks: Vec<SeqChunk> = plan
            .scheduled
            .iter()
            .map(|&(id, n)| {
                let s = &self.scheduler.seqs[&id];
                // An embedding samples nothing: its rows' hidden states come back.
                let sample = s.num_computed_tokens + n == s.num_tokens() && s.pooler.is_none();
                want_logits |= sample && s.params.needs_logits();
                SeqChunk {
                    token_ids: &s.token_ids,
                    start: s.num_computed_tokens,
                    len: n,
                    block_tables: &s.block_table.blocks,
                    sample,
                    // A drafting sequence: a row for the pending token and each draft.
                    logits_from: (s.num_draft > 0).then_some(s.num_computed_tokens),
                    hidden: s.pooler.is_some(),
                }
            })
            .collect();
        let t_trace = Instant::now();
        let traced = self.trace.is_some().then(|| self.trace_entries(&plan.scheduled));
        let trace_secs = t_trace.elapsed().as_secs_f64();
        let started = Instant::now();
        let runner = &self.runner;
        let (result, masks) = std::thread::scope(|sc| {
            let masker = (!guided.is_empty()).then(|| {
                sc.spawn(|| {
                    let t = Instant::now();
                    let m: Vec<_> = guided.iter_mut().map(|(id, m)| (*id, m.compute_mask())).collect();
                    (m, t.elapsed().as_secs_f64())
                })
            });
            let r = runner.execute(&chunks, want_logits);
            (r, masker.map(|h| h.join()))
        });
        let mut masks: std::collections::HashMap<SeqId, _> = match masks {
            Some(Ok((m, secs))) => {
                self.metrics.structured_masks_total += m.len() as u64;
                self.metrics.structured_mask_seconds_total += secs;
                m.into_iter().collect()
            }
            Some(Err(_)) => return Err(EngineError::InvalidRequest("a structured-output mask panicked".into())),
            None => Default::default(),
        };
        drop(chunks);
        for (id, m) in guided {
            if let Some(s) = self.scheduler.seqs.get_mut(&id) {
                s.matcher = Some(m);
            }
        }
        let result = result?;
        // Greedy structured output: masked argmax on the device, beside the
        // step's logits (no logits row comes back).
        let mut gpu_picks = guided::masked_picks(&*self.runner, &mut self.scheduler.seqs, &plan.scheduled, &mut masks)?;
        self.metrics.structured_device_picks_total += gpu_picks.values().filter(|p| p.is_some()).count() as u64;
        if let Some(l) = &result.logits {
            self.metrics.logits_rows_read_total += (l.len() / self.model_config.vocab) as u64;
        }
        self.budget
            .cost
            .observe(plan.num_batched_tokens, started.elapsed().as_secs_f64() * 1e3);
        self.metrics.num_steps_total += 1;
        let now = Instant::now();
        let vocab = self.model_config.vocab;
        let mut outputs = Vec::new();
        let mut finished = Vec::new();
        let mut row = 0;
        let mut token_at = 0;
        let hidden = self.model_config.hidden;
        for &(id, n) in &plan.scheduled {
            let sched = &mut self.scheduler;
            let seq = sched.seqs.get_mut(&id).expect("scheduled sequence exists");
            let first = token_at;
            token_at += n;
            if let (Some(p), Some(h)) = (&mut seq.pooler, &result.hidden) {
                p.add(
                    seq.num_computed_tokens,
                    &h[first * hidden..(first + n) * hidden],
                    hidden,
                );
            }
            seq.num_computed_tokens += n;
            // A drafting sequence: back to its pending token; what to emit.
            let spec = (seq.num_draft > 0).then(|| {
                let k = seq.num_draft;
                let max_k = seq.spec_cfg.as_ref().map_or(k, |c| c.num_speculative_tokens);
                let (toks, j) = match result.logits.as_deref().filter(|_| !seq.params.is_greedy()) {
                    Some(l) => {
                        super::speculative::verify_sampled(seq, &l[row * vocab..(row + k + 1) * vocab], vocab, max_k)
                    }
                    None => super::speculative::verify(seq, &result.argmax[row..row + k + 1], max_k),
                };
                row += k + 1;
                self.metrics.spec_decode_num_drafts_total += 1;
                self.metrics.spec_decode_num_draft_tokens_total += k as u64;
                self.metrics.spec_decode_num_accepted_tokens_total += j as u64;
                (toks, j)
            });
            sched
                .blocks
                .note_computed(&mut seq.block_table, &seq.token_ids, seq.num_computed_tokens);
            if seq.num_computed_tokens != seq.num_tokens() {
                continue;
            }
            if let Some(p) = &seq.pooler {
                outputs.push(super::embedding::finish(
                    seq,
                    p.finish(seq.prompt_len),
                    now,
                    &mut self.metrics,
                ));
                finished.push(id);
                continue;
            }
            let (toks, mut lp, constraint_done) = match &spec {
                Some((toks, _)) => (toks.clone(), None, false),
                None => {
                    let logits = result
                        .logits
                        .as_deref()
                        .filter(|_| seq.params.needs_logits())
                        .map(|l| &l[row * vocab..(row + 1) * vocab]);
                    let (tok, lp, done) = guided::choose_token(
                        seq,
                        gpu_picks.remove(&id),
                        logits,
                        result.argmax[row],
                        masks.remove(&id),
                        &self.tokenizer.eos_ids,
                    );
                    row += 1;
                    (vec![tok], lp, done)
                }
            };
            // Several tokens at once (accepted drafts): the interval since the
            // last token is shared among them.
            let count = toks.len() as f64;
            for tok in toks {
                match seq.times.last_token {
                    None => {
                        seq.times.first_token = Some(now);
                        self.metrics
                            .time_to_first_token_seconds
                            .observe((now - seq.times.arrival).as_secs_f64());
                        self.metrics.prompt_tokens_total += seq.prompt_len as u64;
                    }
                    Some(prev) => self
                        .metrics
                        .inter_token_latency_seconds
                        .observe((now - prev).as_secs_f64() / count),
                }
                seq.times.last_token = Some(now);
                self.metrics.generation_tokens_total += 1;
                let out = postprocess_token(seq, tok, lp.take(), &self.tokenizer, constraint_done);
                let done = out.finish_reason.is_some();
                outputs.push(out);
                if done {
                    finished.push(id);
                    break;
                }
            }
            // The accepted drafts' KV is the cache's now: the sequence stands
            // as after that many plain decodes; blocks past it go back.
            if let Some((_, j)) = spec
                && !seq.is_finished()
            {
                super::speculative::commit_accepted(&mut self.scheduler, id, j);
            }
        }
        for id in finished {
            if let Some(mut seq) = self.scheduler.finish(id) {
                seq.times.finished = Some(now);
                if let (Some(t), SeqStatus::Finished(r)) = (&mut self.trace, seq.status) {
                    t.finished(id, r.as_str(), now);
                }
                let m = request_metrics(&seq, now);
                self.record_finished(&m);
                // The finishing output is its last (a step may emit several tokens of one sequence).
                if let Some(o) = outputs.iter_mut().rev().find(|o| o.id == id) {
                    o.metrics = Some(m);
                }
            }
        }
        self.update_gauges();
        if let Some(entries) = traced {
            let t = Instant::now();
            self.trace_step((started, now), entries, plan.preempted.clone());
            self.metrics.trace_record_seconds_total += trace_secs + t.elapsed().as_secs_f64();
        }
        self.metrics.step_seconds_total += started.elapsed().as_secs_f64();
        Ok(outputs)
    }

    fn record_finished(&mut self, m: &RequestMetrics) {
        self.metrics.request_success_total += 1;
        self.metrics.e2e_request_latency_seconds.observe(m.e2e_latency);
        self.metrics.request_queue_time_seconds.observe(m.queue_time);
        self.metrics.request_prefill_time_seconds.observe(m.prefill_time);
        self.metrics.request_decode_time_seconds.observe(m.decode_time);
    }

    pub(super) fn update_gauges(&mut self) {
        let m = &mut self.metrics;
        let b = &self.scheduler.blocks;
        m.num_requests_running = self.scheduler.running.len() as u64;
        m.num_requests_waiting = self.scheduler.waiting.len() as u64;
        m.kv_cache_usage_perc = b.usage();
        let block_bytes = self.runner.kv_bytes() / b.num_blocks().max(1) as u64;
        let used = (b.num_blocks() - b.num_free_blocks()) as u64;
        m.gpu_memory_allocated_bytes = self.static_bytes + used * block_bytes;
        m.gpu_memory_reserved_bytes = self.static_bytes + self.runner.kv_bytes();
        if let Some(d) = &self.draft {
            m.gpu_memory_allocated_bytes += d.allocated_bytes();
            m.gpu_memory_reserved_bytes += d.static_bytes + d.kv_bytes();
        }
        let p = self.runner.pipeline_stats();
        (m.pipelines_compiled_total, m.pipeline_compile_seconds_total) = (p.compiled, p.compile_seconds);
        m.gpu_memory_allocated_peak_bytes = m.gpu_memory_allocated_peak_bytes.max(m.gpu_memory_allocated_bytes);
        m.gpu_memory_reserved_peak_bytes = m.gpu_memory_reserved_peak_bytes.max(m.gpu_memory_reserved_bytes);
    }

    /// Drops the prefix cache's free blocks (they return to the clean free list).
    pub fn reset_prefix_cache(&mut self) {
        self.scheduler.blocks.reset_prefix_cache();
        self.update_gauges();
    }

    /// Checks the block pool against the live sequences.
    pub fn check_blocks(&self) -> Result<(), String> {
        self.scheduler
            .blocks
            .check_consistency(self.scheduler.seqs.values().map(|s| &s.block_table))?;
        match &self.draft {
            Some(d) => d.check_blocks().map_err(|e| format!("draft model's pool: {e}")),
            None => Ok(()),
        }
    }
}
