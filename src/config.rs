//! The engine's settings, on their own so that every layer that reads them
//! (backend, engine, CLI, server) can import them without importing each other.

use std::path::PathBuf;

pub use crate::kv_dtype::{KvDtype, q8_block};

/// Settings of an engine (the CLI flags of every subcommand that starts one).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// A .gguf file or a Hugging Face directory.
    pub model: PathBuf,
    /// The backend: wgpu, cuda, or auto (cuda when built with it and an NVIDIA device exists).
    pub device: Device,
    /// Substring of the wgpu adapter name (the CLI also reads `WLLM_ADAPTER`); `None`: the best adapter.
    pub adapter: Option<String>,
    /// Bytes of the KV pool; `None`: planned from the adapter's memory
    /// (`engine::MemoryPlan`), else 512 MiB, within the adapter's binding limit.
    pub kv_cache_memory: Option<u64>,
    /// The share of the adapter's memory this engine may take (weights, step
    /// buffers and the KV pool), as vLLM's `--gpu-memory-utilization`; `None`:
    /// 0.9 on GPUs that report their memory, the fixed pool on CPU adapters.
    pub gpu_memory_utilization: Option<f64>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Token budget of one step (the prefill chunk size).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Longest prompt + output; default: the model's context, capped by the pool.
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// The KV cache's element type; `None`: auto (f16).
    pub kv_cache_dtype: Option<KvDtype>,
    /// Keep the layers of a model with sliding-window layers (Gemma 2/3) in KV
    /// groups that release blocks out of the window (vLLM's hybrid KV cache
    /// manager); off: one flat pool, every layer a block per token block.
    pub hybrid_kv_cache: bool,
    /// Where compiled GPU pipelines persist between runs (default: the user's cache directory).
    pub pipeline_cache: PipelineCacheDir,
    /// Register tiles of the WGSL gemm; `None`: chosen for the adapter.
    pub gemm_tiles: Option<GemmTiles>,
    /// cuda: row count from which gemm uses cuBLAS (0 = never); `None`: 32.
    pub cublas_min_t: Option<u32>,
    /// The step time a step with decodes aims at (its prefill chunk is cut to fit).
    pub step_target: StepTarget,
    /// Quantise the weights at load to this llama.cpp mix (e.g. an HF directory at Q4_K_M).
    pub quantize: Option<crate::quant::mix::Mix>,
    /// Steps the trace recorder keeps (a ring of the most recent); 0 records nothing.
    pub trace_steps: usize,
    /// Speculative decoding (`engine::speculative`); `None`: off.
    pub speculative: Option<SpeculativeConfig>,
}

impl EngineConfig {
    /// The KV cache's element type, auto resolved (f16).
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_cache_dtype.unwrap_or_default()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            device: Device::Auto,
            adapter: None,
            kv_cache_memory: None,
            gpu_memory_utilization: None,
            block_size: 16,
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            max_model_len: None,
            enable_prefix_caching: true,
            kv_cache_dtype: None,
            hybrid_kv_cache: true,
            pipeline_cache: PipelineCacheDir::User,
            gemm_tiles: None,
            cublas_min_t: None,
            step_target: StepTarget::Auto,
            quantize: None,
            trace_steps: 0,
            speculative: None,
        }
    }
}

/// How to speculate (vLLM's `speculative_config` shape for `ngram` and `draft_model`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// Drafting method: `ngram` (prompt lookup) or `draft_model` (a smaller
    /// model of the same vocabulary, `model`). Left out: `draft_model` where
    /// `model` is given, else `ngram` (as vLLM infers it).
    #[serde(default)]
    pub method: String,
    /// The draft model's file (GGUF, or a Hugging Face directory) for `draft_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<std::path::PathBuf>,
    /// Most tokens drafted a step for a sequence.
    pub num_speculative_tokens: usize,
    /// Longest n-gram matched against the earlier tokens.
    #[serde(default = "default_max")]
    pub prompt_lookup_max: usize,
    /// Shortest n-gram matched.
    #[serde(default = "default_min")]
    pub prompt_lookup_min: usize,
    /// wllm's: draft only as many tokens as the expected acceptance pays for
    /// at the measured step cost (backs off with large batches on CPU
    /// adapters); `false` drafts up to `num_speculative_tokens` whatever a
    /// row costs (what the drafts are then depends on no timing).
    #[serde(default = "yes")]
    pub adaptive: bool,
}

/// The longest n-gram prompt lookup may match (`prompt_lookup_max`): a
/// draft costs up to this many passes over the sequence's tokens, on the
/// engine thread, every step.
pub const MAX_PROMPT_LOOKUP: usize = 16;

/// The most tokens a sequence may draft a step (`num_speculative_tokens`).
pub const MAX_SPECULATIVE_TOKENS: usize = 64;

fn yes() -> bool {
    true
}

fn default_max() -> usize {
    4
}
fn default_min() -> usize {
    2
}

impl SpeculativeConfig {
    /// Prompt lookup drafting `k` tokens at most (lookup n-grams 2 to 4).
    pub fn ngram(k: usize) -> Self {
        Self {
            method: "ngram".into(),
            model: None,
            num_speculative_tokens: k,
            prompt_lookup_max: default_max(),
            prompt_lookup_min: default_min(),
            adaptive: true,
        }
    }

    /// A draft model at `path` drafting `k` tokens at most.
    pub fn draft_model(path: impl Into<std::path::PathBuf>, k: usize) -> Self {
        Self {
            method: "draft_model".into(),
            model: Some(path.into()),
            ..Self::ngram(k)
        }
    }

    /// Whether drafts come from a draft model (else from prompt lookup).
    pub fn uses_draft_model(&self) -> bool {
        self.method == "draft_model"
    }

    /// Parses vLLM's JSON form (`{"method": "ngram", "num_speculative_tokens": 4, ...}`),
    /// checking the values.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut c: Self = serde_json::from_str(s).map_err(|e| {
            format!(
                "--speculative-config: {e}; expected e.g. {{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \
                 \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}} or {{\"model\": \"draft.gguf\", \
                 \"num_speculative_tokens\": 4}}"
            )
        })?;
        if c.method.is_empty() {
            c.method = if c.model.is_some() { "draft_model" } else { "ngram" }.into();
        }
        c.check()?;
        Ok(c)
    }

    /// Refuses values that cannot draft.
    pub fn check(&self) -> Result<(), String> {
        match (self.method.as_str(), &self.model) {
            ("ngram", None) | ("draft_model", Some(_)) => {}
            ("ngram", Some(_)) => {
                return Err(
                    "speculative method \"ngram\" takes no \"model\"; for a draft model use \
                            \"method\": \"draft_model\""
                        .into(),
                );
            }
            ("draft_model", None) => {
                return Err("speculative method \"draft_model\" needs \"model\": the draft model's file".into());
            }
            (m, _) => {
                return Err(format!(
                    "speculative method {m:?} is not supported; use \"ngram\" (prompt lookup) or \"draft_model\" \
                     (with \"model\")"
                ));
            }
        }
        if self.num_speculative_tokens == 0 || self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS {
            return Err(format!(
                "num_speculative_tokens must be 1 to {MAX_SPECULATIVE_TOKENS}, got {}",
                self.num_speculative_tokens
            ));
        }
        if self.prompt_lookup_max > MAX_PROMPT_LOOKUP {
            return Err(format!(
                "prompt_lookup_max must be at most {MAX_PROMPT_LOOKUP}, got {} (each draft searches the whole \
                 context for every n-gram length up to it)",
                self.prompt_lookup_max
            ));
        }
        if self.prompt_lookup_min == 0 || self.prompt_lookup_min > self.prompt_lookup_max {
            return Err(format!(
                "prompt_lookup_min ({}) must be at least 1 and at most prompt_lookup_max ({})",
                self.prompt_lookup_min, self.prompt_lookup_max
            ));
        }
        Ok(())
    }
}

/// How an embedding pools the final hidden states of a prompt's tokens
/// (llama.cpp's `--pooling`): their mean, the first token's (`cls`) or the
/// last token's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    Mean,
    Cls,
    Last,
}

impl Pooling {
    /// From a GGUF's `{arch}.pooling_type` (llama.cpp's numbering: 1 mean, 2 cls, 3 last).
    pub fn from_gguf(v: u64) -> Option<Self> {
        match v {
            1 => Some(Self::Mean),
            2 => Some(Self::Cls),
            3 => Some(Self::Last),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an embedding request asks for: the pooling, and whether the vector
/// is scaled to unit length (L2, llama.cpp's default `--embd-normalize 2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedSpec {
    pub pooling: Pooling,
    pub normalize: bool,
}

/// A request's own speculation settings (its body's `speculative_config`, in
/// the engine flag's shape less `model`): each field given replaces the
/// engine's. `num_speculative_tokens: 0` turns speculation off for the
/// request; on an engine started without speculation, the request turns on
/// prompt lookup for itself (it costs no memory); `draft_model` needs an
/// engine started with one.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpeculation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_speculative_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_lookup_max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_lookup_min: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<bool>,
}

/// Tokens a request drafts a step where it turns speculation on itself and names no count.
pub const DEFAULT_REQUEST_SPECULATIVE_TOKENS: usize = 4;

impl RequestSpeculation {
    /// The settings a request runs with: its own over the engine's (`None`: no speculation).
    pub fn resolve(
        req: Option<&Self>,
        engine: Option<&SpeculativeConfig>,
    ) -> Result<Option<SpeculativeConfig>, String> {
        let Some(r) = req else {
            return Ok(engine.cloned());
        };
        if r.num_speculative_tokens == Some(0) {
            return Ok(None);
        }
        let mut c = match (r.method.as_deref(), engine) {
            (None, Some(e)) => e.clone(),
            (Some(m), Some(e)) if m == e.method => e.clone(),
            (None | Some("ngram"), _) => {
                let mut c = SpeculativeConfig::ngram(DEFAULT_REQUEST_SPECULATIVE_TOKENS);
                if let Some(e) = engine {
                    c.num_speculative_tokens = e.num_speculative_tokens;
                    c.adaptive = e.adaptive;
                }
                c
            }
            (Some("draft_model"), _) => {
                return Err(
                    "speculative_config asks for \"draft_model\", but this engine has no draft model: \
                            start it with --draft-model PATH, or ask for \"ngram\""
                        .into(),
                );
            }
            (Some(m), _) => {
                return Err(format!(
                    "speculative_config method {m:?} is not supported; use \"ngram\" or \"draft_model\""
                ));
            }
        };
        if let Some(k) = r.num_speculative_tokens {
            c.num_speculative_tokens = k;
        }
        if let Some(n) = r.prompt_lookup_max {
            c.prompt_lookup_max = n;
        }
        if let Some(n) = r.prompt_lookup_min {
            c.prompt_lookup_min = n;
        }
        if let Some(a) = r.adaptive {
            c.adaptive = a;
        }
        c.check().map_err(|e| format!("speculative_config: {e}"))?;
        Ok(Some(c))
    }
}

/// The step time a step with decodes aims at.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum StepTarget {
    /// 1.5 × the predicted decode step of all live requests (`engine::step_budget`).
    #[default]
    Auto,
    /// Milliseconds.
    Ms(f64),
    /// This many times the predicted decode step of all live requests.
    Factor(f64),
    /// No target: every step may batch `max_num_batched_tokens`.
    Off,
}

impl std::str::FromStr for StepTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "off" | "none" => Ok(Self::Off),
            t => {
                let (num, factor) = match t.strip_suffix('x') {
                    Some(f) => (f, true),
                    None => (t, false),
                };
                match num.trim().parse::<f64>() {
                    Ok(v) if v.is_finite() && factor && v >= 1.0 => Ok(Self::Factor(v)),
                    Ok(v) if v.is_finite() && !factor && v > 0.0 => Ok(Self::Ms(v)),
                    _ => Err(format!(
                        "step target {s:?}: want auto, off, milliseconds above 0, or a multiple of a decode step of at least 1 (e.g. 2x)"
                    )),
                }
            }
        }
    }
}

impl std::fmt::Display for StepTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Off => write!(f, "off"),
            Self::Ms(v) => write!(f, "{v}"),
            Self::Factor(v) => write!(f, "{v}x"),
        }
    }
}

/// The backend asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// cuda when built with it and an NVIDIA device exists, else wgpu.
    #[default]
    Auto,
    /// WGSL kernels through wgpu (Vulkan, Metal, DX12, lavapipe).
    Wgpu,
    /// CUDA C kernels through the NVIDIA driver (`--features cuda`).
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "wgpu" | "vulkan" | "metal" | "dx12" => Ok(Self::Wgpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(format!("unknown device {other:?}: use wgpu, cuda or auto")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        })
    }
}

/// Where compiled pipelines persist between runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PipelineCacheDir {
    /// `$XDG_CACHE_HOME/wllm` (or the platform's cache directory).
    #[default]
    User,
    /// This directory.
    At(PathBuf),
    /// Nowhere: compile every run.
    Off,
}

/// Register-tile shapes of the WGSL gemm (see shaders/gemm.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GemmTiles {
    /// Output columns per lane of a decode (one-row) tile.
    pub decode_tn: u32,
    /// Rows and columns of a float-weight prefill tile.
    pub prefill_tm: u32,
    pub prefill_tn: u32,
    /// Rows of a quantised-weight prefill tile.
    pub quant_prefill_tm: u32,
    /// Lanes per workgroup.
    pub wg: u32,
}

impl GemmTiles {
    /// lavapipe: one workgroup runs on one thread as 8 SIMD lanes; big register
    /// tiles amortise loads (see DESIGN.md, "what a probe found"). Prefill
    /// tiles 24 columns wide: with x and the weights read from textures,
    /// `cargo bench --bench kernels` gave +5-20 % GFLOP/s over 16 in every format.
    /// Decode tiles 24 columns wide too: with the norm fused into the gemm each
    /// x and norm-weight texel serves more columns (default model, one row,
    /// `wllm profile`: a step 27.4-28.3 ms at 16 columns, 24.7-25.1 at 24,
    /// 25.6-25.9 at 32).
    pub fn cpu() -> Self {
        Self {
            decode_tn: 24,
            prefill_tm: 32,
            prefill_tn: 24,
            quant_prefill_tm: 16,
            wg: 8,
        }
    }

    /// GPUs: 32-lane workgroups (one warp on NVIDIA) and small tiles, so that
    /// a small model's narrow gemms still spread over many workgroups: a decode
    /// lane computes one column (the silu and rope epilogues two), a batch or
    /// prefill lane 4 rows x 4 columns. Swept with `WLLM_GEMM_TILES` on an
    /// NVIDIA H200 (Vulkan), default model, `wllm profile --batch 1,16
    /// --prefill 512`: decode at 1 / 16 rows and a 512-token chunk took 6.10 /
    /// 18.74 / 26.81 ms a step with the former 4,8,8,8,64 and 4.25 / 6.96 /
    /// 16.84 ms with these (17 tile sets tried; 64-lane workgroups or 8-row
    /// tiles were slower at every size). `wllm bench serve`: 151 -> 227 output
    /// tok/s at concurrency 1, 630 -> 1763 at 16, 2209 -> 4864 at 64.
    pub fn gpu() -> Self {
        Self {
            decode_tn: 1,
            prefill_tm: 4,
            prefill_tn: 4,
            quant_prefill_tm: 4,
            wg: 32,
        }
    }
}

impl std::str::FromStr for GemmTiles {
    type Err = String;
    /// `decode_tn,prefill_tm,prefill_tn,quant_prefill_tm,wg`, each at least 1.
    fn from_str(s: &str) -> Result<Self, String> {
        let v: Vec<u32> = s
            .split(',')
            .map(|x| x.trim().parse::<u32>().map_err(|e| format!("{x:?}: {e}")))
            .collect::<Result<_, _>>()?;
        if v.len() != 5 || v.iter().any(|&x| x == 0 || x > 64) {
            return Err(format!(
                "gemm tiles {s:?}: want 5 numbers from 1 to 64: decode_tn,prefill_tm,prefill_tn,quant_prefill_tm,wg"
            ));
        }
        Ok(Self {
            decode_tn: v[0],
            prefill_tm: v[1],
            prefill_tn: v[2],
            quant_prefill_tm: v[3],
            wg: v[4],
        })
    }
}
