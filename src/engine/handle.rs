//! Engine: the handle apps embed. It is Send + Sync + Clone; the step loop of an
//! `LlmEngine` runs on its own thread; `generate` returns a `RequestStream` of
//! incremental outputs, usable as a blocking iterator and as a `futures` Stream.
//! Dropping the stream aborts the request and frees its blocks.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll};

use tokio::sync::mpsc as tmpsc;

use super::llm_engine::LlmEngine;
use super::model_event::ModelEvent;
use super::output::{RequestMetrics, RequestOutput};
use super::request::{Prompt, tokenize_prompt, validate_request};
use super::{EngineConfig, EngineError, FinishReason, KvPlan, SeqId};
use crate::config::{EmbedSpec, Pooling};
use crate::metrics::Metrics;
use crate::model::ModelConfig;
use crate::sampling::{SampledLogprobs, SamplingParams};
use crate::tokenizer::Tokenizer;

type Item = Result<RequestOutput, EngineError>;

/// One sequence to add: its id, scheduling group, prompt ids, parameters and
/// the channel its outputs go to.
struct AddSeq {
    id: SeqId,
    group: Option<SeqId>,
    prompt: Vec<u32>,
    /// Shared by the request's sequences.
    params: Arc<SamplingParams>,
    /// Its place among the request's `n` (its seed is the request's plus this).
    seed_offset: u64,
    /// Its constraint's matcher, compiled by the caller (never on the engine thread).
    matcher: Option<Box<crate::sampling::constraint::Matcher>>,
    out: tmpsc::UnboundedSender<Item>,
    /// When the caller asked: the request's TTFT and queue time count from
    /// here, not from when the engine thread took it (after a step or `prime`).
    arrival: std::time::Instant,
}

enum Command {
    /// Sequences added together, before the engine's next step.
    Add(Vec<AddSeq>),
    Abort(SeqId),
    Metrics(mpsc::Sender<Metrics>),
    BlockStats(mpsc::Sender<BlockStats>),
    ResetPrefixCache(mpsc::Sender<()>),
    Trace(mpsc::Sender<Option<serde_json::Value>>),
    Live(usize, mpsc::Sender<serde_json::Value>),
    ModelEvent(Box<ModelEvent>),
    Shutdown,
}

/// The block pool as the engine thread sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockStats {
    pub num_blocks: usize,
    pub num_free: usize,
    pub num_live_sequences: usize,
    /// `Err` describes a broken invariant (a block owned twice, a ref count off).
    pub consistent: Result<(), String>,
}

struct Inner {
    tx: Mutex<mpsc::Sender<Command>>,
    next_id: AtomicU64,
    tokenizer: Arc<Tokenizer>,
    guide: Arc<crate::sampling::constraint::Guide>,
    model_config: ModelConfig,
    plan: KvPlan,
    memory: super::MemoryPlan,
    adapter: String,
    load_timings: super::LoadTimings,
    speculative: Option<crate::config::SpeculativeConfig>,
    /// The engine thread's metrics as of its last step or command.
    published: MetricsHandle,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Command::Shutdown);
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// A running engine. Cloning shares it; the last clone dropped stops its thread.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Loads the model and starts the step loop.
    pub fn new(cfg: &EngineConfig) -> Result<Self, EngineError> {
        Ok(Self::from_core(LlmEngine::new(cfg)?))
    }

    /// Starts the step loop around an engine core.
    pub fn from_core(core: LlmEngine) -> Self {
        Self::spawn(core, false)
    }

    /// As `from_core`, the engine thread first priming the pipelines of short
    /// prompts (`LlmEngine::prime`) while the caller waits on something else
    /// (a person typing); a command that arrives meanwhile stops the priming
    /// after its current step. A device error there is left for the first
    /// request's step to meet and report.
    pub fn from_core_primed(core: LlmEngine) -> Self {
        Self::spawn(core, true)
    }

    fn spawn(core: LlmEngine, prime: bool) -> Self {
        let (tx, rx) = mpsc::channel();
        let tokenizer = core.tokenizer.clone();
        let guide = core.guide.clone();
        let model_config = core.model_config.clone();
        let plan = core.plan.clone();
        let memory = core.memory.clone();
        let adapter = core.runner.describe();
        let load_timings = core.load_timings.clone();
        let speculative = core.speculative.clone();
        let published = Arc::new(Mutex::new(core.metrics.clone()));
        let cell = MetricsHandle(published.clone());
        let thread = std::thread::Builder::new()
            .name("wllm-engine".into())
            .spawn(move || {
                let mut core = core;
                let mut early = None;
                if prime {
                    // (An error here is the device's: the first step meets it again.)
                    let _ = core.prime(|| match rx.try_recv() {
                        Ok(c) => {
                            early = Some(c);
                            false
                        }
                        Err(_) => true,
                    });
                }
                run_loop(core, rx, early, cell)
            })
            .expect("spawn the engine thread");
        Self {
            inner: Arc::new(Inner {
                tx: Mutex::new(tx),
                next_id: AtomicU64::new(0),
                tokenizer,
                guide,
                model_config,
                plan,
                memory,
                adapter,
                load_timings,
                speculative,
                published: MetricsHandle(published),
                thread: Mutex::new(Some(thread)),
            }),
        }
    }

    fn send(&self, c: Command) -> Result<(), EngineError> {
        self.inner
            .tx
            .lock()
            .map_err(|_| EngineError::Stopped)?
            .send(c)
            .map_err(|_| EngineError::Stopped)
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }

    /// Structured-output constraints compiled so far, on any thread (`Guide::compiled`).
    pub fn constraints_compiled(&self) -> usize {
        self.inner.guide.compiled()
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.inner.model_config
    }

    pub fn kv_plan(&self) -> &KvPlan {
        &self.inner.plan
    }

    /// Weights / step buffers / KV pool of the adapter's memory, planned at start.
    pub fn memory_plan(&self) -> &super::MemoryPlan {
        &self.inner.memory
    }

    /// The adapter the engine runs on.
    /// Where the load's time went.
    pub fn load_timings(&self) -> &super::LoadTimings {
        &self.inner.load_timings
    }

    pub fn adapter(&self) -> &str {
        &self.inner.adapter
    }

    /// Token ids of a prompt (chat prompts through the template).
    pub fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        tokenize_prompt(&self.inner.tokenizer, prompt, self.inner.plan.max_model_len)
    }

    /// Starts a request. Errors (bad parameters, prompt too long) come back here.
    pub fn generate(&self, prompt: Prompt, params: SamplingParams) -> Result<RequestStream, EngineError> {
        self.generate_in(prompt, params, None)
    }

    /// As `generate`, as part of a group of sequences (e.g. the prompts × n of
    /// one HTTP request, grouped under the first one's id): the scheduler
    /// admits groups in turn, so a large group does not hold back others.
    pub fn generate_in(
        &self,
        prompt: Prompt,
        params: SamplingParams,
        group: Option<SeqId>,
    ) -> Result<RequestStream, EngineError> {
        let mut streams = self.generate_group(vec![(prompt, vec![params])], group)?;
        Ok(streams.remove(0))
    }

    /// Starts one sequence per (prompt, parameters) pair, each prompt
    /// tokenized once, as one scheduling group (under `group`, else the
    /// first sequence's id). Every sequence is checked before any starts, and
    /// they reach the engine together, before its next step. Streams come
    /// back in order.
    pub fn generate_group(
        &self,
        prompts: Vec<(Prompt, Vec<SamplingParams>)>,
        group: Option<SeqId>,
    ) -> Result<Vec<RequestStream>, EngineError> {
        let mut planned = Vec::new();
        for (prompt, params_of) in prompts {
            let ids = Arc::new(self.tokenize(&prompt)?);
            for params in params_of {
                let params = Arc::new(params);
                self.validate(&ids, &params)?;
                let matcher = self.compile(&params)?;
                planned.push((ids.clone(), params, 0, matcher));
            }
        }
        self.start(planned, group)
    }

    /// `n` sequences for each prompt, all sharing one `params` (never cloned
    /// per sequence; the i-th of a prompt's `n` draws with seed + i), as one
    /// scheduling group: what an API request with `n` choices starts. The
    /// parameters are checked and a structured-output constraint compiled
    /// once, here on the caller's thread (keep it off an async runtime:
    /// tokenizing, the chat template and a grammar can take a while), never
    /// on the engine thread. Streams come back prompt by prompt, `n` each.
    pub fn generate_n(
        &self,
        prompts: Vec<Prompt>,
        params: SamplingParams,
        n: usize,
    ) -> Result<Vec<RequestStream>, EngineError> {
        let params = Arc::new(params);
        let mut prompt_ids = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let ids = Arc::new(self.tokenize(&prompt)?);
            self.validate(&ids, &params)?;
            prompt_ids.push(ids);
        }
        // The constraint does not depend on the prompt: one compile, a copy a sequence.
        let matcher = self.compile(&params)?;
        let mut planned = Vec::with_capacity(prompt_ids.len() * n);
        for ids in prompt_ids {
            for i in 0..n as u64 {
                planned.push((ids.clone(), params.clone(), i, matcher.as_ref().map(|m| m.deep_clone())));
            }
        }
        self.start(planned, None)
    }

    /// Checks one sequence's request as the engine will (prompt, parameters,
    /// speculation): this call's error, not the stream's.
    fn validate(&self, ids: &[u32], params: &SamplingParams) -> Result<(), EngineError> {
        validate_request(
            ids,
            params,
            self.inner.model_config.vocab,
            self.inner.plan.max_model_len,
        )?;
        crate::config::RequestSpeculation::resolve(params.speculative_config.as_ref(), self.inner.speculative.as_ref())
            .map_err(|e| EngineError::Params(crate::sampling::InvalidParams("speculative_config", e)))?;
        Ok(())
    }

    /// The matcher of the request's constraint, if it has one (a constraint
    /// that cannot compile is this call's error, not the stream's).
    fn compile(&self, params: &SamplingParams) -> Result<Option<crate::sampling::constraint::Matcher>, EngineError> {
        params
            .constraint
            .as_ref()
            .map(|c| {
                self.inner
                    .guide
                    .matcher(c, self.inner.model_config.vocab)
                    .map_err(|e| EngineError::InvalidRequest(e.to_string()))
            })
            .transpose()
    }

    /// Sends checked sequences to the engine as one group.
    #[allow(clippy::type_complexity)]
    fn start(
        &self,
        planned: Vec<(
            Arc<Vec<u32>>,
            Arc<SamplingParams>,
            u64,
            Option<crate::sampling::constraint::Matcher>,
        )>,
        group: Option<SeqId>,
    ) -> Result<Vec<RequestStream>, EngineError> {
        let mut seqs: Vec<AddSeq> = Vec::with_capacity(planned.len());
        let mut streams = Vec::with_capacity(planned.len());
        for (ids, params, seed_offset, matcher) in planned {
            let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
            let (out, rx) = tmpsc::unbounded_channel();
            seqs.push(AddSeq {
                id,
                group: group.or(seqs.first().map(|s| s.id)),
                prompt: ids.to_vec(),
                params,
                seed_offset,
                matcher: matcher.map(Box::new),
                out,
                arrival: std::time::Instant::now(),
            });
            streams.push(RequestStream {
                id,
                rx,
                engine: self.clone(),
                done: false,
                prompt_token_ids: ids,
            });
        }
        self.send(Command::Add(seqs))?;
        Ok(streams)
    }

    /// Embeds each input (text or token ids) as one scheduling group: each a
    /// prefill-only sequence scheduled with everything else, whose prompt's
    /// final hidden states are pooled (`EmbedSpec`). Streams come back in
    /// order, each with one output carrying `embedding`; `embed_blocking`
    /// waits for the vectors.
    pub fn embed(&self, inputs: Vec<Prompt>, spec: EmbedSpec) -> Result<Vec<RequestStream>, EngineError> {
        let params = SamplingParams {
            embed: Some(spec),
            max_tokens: None,
            temperature: 0.0,
            ..Default::default()
        };
        self.generate_group(inputs.into_iter().map(|p| (p, vec![params.clone()])).collect(), None)
    }

    /// `embed`, waiting: each input's vector and its token count.
    pub fn embed_blocking(&self, inputs: Vec<Prompt>, spec: EmbedSpec) -> Result<Vec<(Vec<f32>, usize)>, EngineError> {
        self.embed(inputs, spec)?
            .into_iter()
            .map(|s| {
                let c = s.collect_all()?;
                let n = c.prompt_token_ids.len();
                c.embedding.map(|e| (e, n)).ok_or(EngineError::Stopped)
            })
            .collect()
    }

    /// The pooling the model's file names, else mean (llama.cpp's default for
    /// a model without one is none, which OpenAI's embeddings cannot return).
    pub fn default_pooling(&self) -> Pooling {
        self.inner.model_config.pooling.unwrap_or(Pooling::Mean)
    }

    /// Whether no more than `handles` handles on this engine exist (streams
    /// of requests in flight hold one each): with the caller's own, 1 means
    /// nothing else uses it.
    pub fn is_idle_but(&self, handles: usize) -> bool {
        Arc::strong_count(&self.inner) <= handles
    }

    /// A handle that does not keep the engine alive (`WeakEngine::is_alive`
    /// tells whether some clone still does: its memory is still held).
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.inner))
    }

    /// A handle on the metrics the engine thread publishes after every
    /// step and command (before a step's outputs are sent, so a finished
    /// request is counted in them): what a scrape reads without asking the
    /// engine thread, without waiting on its step and without holding the
    /// engine (the handle does not keep it alive).
    pub fn metrics_handle(&self) -> MetricsHandle {
        self.inner.published.clone()
    }

    /// Aborts a request by id.
    pub fn abort(&self, id: SeqId) {
        let _ = self.send(Command::Abort(id));
    }

    /// A snapshot of the engine's metrics.
    pub fn metrics(&self) -> Result<Metrics, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Metrics(tx))?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// The block pool's state and invariants (after the engine's next loop turn).
    pub fn block_stats(&self) -> Result<BlockStats, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::BlockStats(tx))?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// The step trace so far, as Chrome Trace Event Format JSON; an error when
    /// the engine records none (`EngineConfig::trace_steps` is 0).
    pub fn trace(&self) -> Result<serde_json::Value, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Trace(tx))?;
        rx.recv()
            .map_err(|_| EngineError::Stopped)?
            .ok_or_else(|| EngineError::Config("this engine records no trace (set trace_steps / --trace)".into()))
    }

    /// The live view of the engine (requests, pool, block map, the last
    /// `steps` steps' timeline when it records a trace).
    pub fn live_state(&self, steps: usize) -> Result<serde_json::Value, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Live(steps, tx))?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// Puts another model's load or unload in this engine's step trace (a
    /// server's registry observer calls it on the primary engine); nothing
    /// where the engine records no trace.
    pub fn trace_model_event(&self, e: &ModelEvent) {
        let _ = self.send(Command::ModelEvent(Box::new(e.clone())));
    }

    /// Empties the prefix cache of blocks no sequence holds.
    pub fn reset_prefix_cache(&self) -> Result<(), EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::ResetPrefixCache(tx))?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }
}

/// The metrics an engine thread publishes (`Engine::metrics_handle`).
#[derive(Clone)]
pub struct MetricsHandle(Arc<Mutex<Metrics>>);

impl MetricsHandle {
    /// The metrics as of the engine thread's last step or command.
    pub fn snapshot(&self) -> Metrics {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn publish(&self, m: &Metrics) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = m.clone();
    }
}

/// An `Engine` that does not keep it alive.
#[derive(Clone)]
pub struct WeakEngine(std::sync::Weak<Inner>);

impl WeakEngine {
    /// Whether some `Engine` clone (a registry slot, a request, a scrape) still holds it.
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }

    /// The engine, where it is still alive.
    pub fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(|inner| Engine { inner })
    }
}

/// The engine thread: takes commands, steps while requests are unfinished.
/// `early`: a command taken before the loop (one that stopped `prime`).
fn run_loop(mut core: LlmEngine, rx: mpsc::Receiver<Command>, mut early: Option<Command>, published: MetricsHandle) {
    let mut streams: HashMap<SeqId, tmpsc::UnboundedSender<Item>> = HashMap::new();
    loop {
        // Wait for work when idle; otherwise take whatever has arrived.
        let first = if let Some(c) = early.take() {
            Some(c)
        } else if core.has_unfinished() {
            None
        } else {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        };
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Command::Add(seqs) => {
                    for AddSeq {
                        id,
                        group,
                        prompt,
                        params,
                        seed_offset,
                        matcher,
                        out,
                        arrival,
                    } in seqs
                    {
                        match core.add_sequence(id, prompt, params, seed_offset, group.unwrap_or(id), arrival, matcher)
                        {
                            Ok(()) => {
                                streams.insert(id, out);
                            }
                            Err(e) => {
                                let _ = out.send(Err(e));
                            }
                        }
                    }
                }
                Command::Abort(id) => {
                    core.abort(id);
                    streams.remove(&id);
                }
                Command::Metrics(tx) => {
                    let _ = tx.send(core.metrics.clone());
                }
                Command::BlockStats(tx) => {
                    let b = &core.scheduler.blocks;
                    let _ = tx.send(BlockStats {
                        num_blocks: b.num_blocks(),
                        num_free: b.num_free_blocks(),
                        num_live_sequences: core.scheduler.seqs.len(),
                        consistent: core.check_blocks(),
                    });
                }
                Command::ResetPrefixCache(tx) => {
                    core.reset_prefix_cache();
                    let _ = tx.send(());
                }
                Command::Trace(tx) => {
                    let _ = tx.send(core.trace_json());
                }
                Command::ModelEvent(e) => core.trace_model_event(&e),
                Command::Live(steps, tx) => {
                    let _ = tx.send(core.live_state(steps));
                }
                Command::Shutdown => return,
            }
        }
        published.publish(&core.metrics);
        if !core.has_unfinished() {
            continue;
        }
        let stepped = core.step();
        published.publish(&core.metrics);
        match stepped {
            Ok(outputs) => {
                for o in outputs {
                    let (id, done) = (o.id, o.finish_reason.is_some());
                    let delivered = streams.get(&id).is_some_and(|s| s.send(Ok(o)).is_ok());
                    if done || !delivered {
                        streams.remove(&id);
                        if !done {
                            core.abort(id);
                        }
                    }
                }
            }
            Err(e) => {
                // A failed step fails every live request; the engine keeps serving new ones.
                let msg = e.to_string();
                let ids: Vec<SeqId> = streams.keys().copied().collect();
                for id in ids {
                    core.abort(id);
                    if let Some(s) = streams.remove(&id) {
                        let _ = s.send(Err(EngineError::Step(msg.clone())));
                    }
                }
            }
        }
    }
}

/// The outputs of one request. Iterate (blocking) or poll as a `Stream`; the
/// blocking iterator must not be used from inside an async runtime.
pub struct RequestStream {
    id: SeqId,
    rx: tmpsc::UnboundedReceiver<Item>,
    engine: Engine,
    done: bool,
    /// Shared by the request's `n` sequences of one prompt.
    prompt_token_ids: Arc<Vec<u32>>,
}

/// A whole request's result, gathered from its stream.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CompletedRequest {
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: Option<FinishReason>,
    pub logprobs: Vec<SampledLogprobs>,
    pub metrics: Option<RequestMetrics>,
    /// An embedding request's vector.
    pub embedding: Option<Vec<f32>>,
}

impl RequestStream {
    pub fn id(&self) -> SeqId {
        self.id
    }

    pub fn prompt_token_ids(&self) -> &[u32] {
        &self.prompt_token_ids
    }

    fn note(&mut self, item: &Option<Item>) {
        match item {
            Some(Ok(o)) if o.finish_reason.is_none() => {}
            _ => self.done = true,
        }
    }

    /// Blocks until the request finishes and returns everything it produced.
    pub fn collect_all(mut self) -> Result<CompletedRequest, EngineError> {
        let mut c = CompletedRequest {
            prompt_token_ids: self.prompt_token_ids.to_vec(),
            ..Default::default()
        };
        for item in self.by_ref() {
            let o = item?;
            c.text.push_str(&o.text);
            c.token_ids.extend(o.token_ids);
            c.logprobs.extend(o.logprobs);
            if o.embedding.is_some() {
                c.embedding = o.embedding;
            }
            if o.finish_reason.is_some() {
                c.finish_reason = o.finish_reason;
                c.metrics = o.metrics;
            }
        }
        Ok(c)
    }
}

impl Iterator for RequestStream {
    type Item = Item;
    fn next(&mut self) -> Option<Item> {
        if self.done {
            return None;
        }
        let item = self.rx.blocking_recv();
        self.note(&item);
        item
    }
}

impl futures_core::Stream for RequestStream {
    type Item = Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let p = self.rx.poll_recv(cx);
        if let Poll::Ready(item) = &p {
            self.note(item);
        }
        p
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}
