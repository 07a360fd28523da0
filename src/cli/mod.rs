//! Subcommands of the binary, and the engine flags they share.

pub mod bench;
pub mod bench_prefix;
pub mod bench_serve;
pub mod bench_soak;
pub mod bench_workload;
pub mod chat;
pub mod embed;
pub mod generate;
pub mod info;
pub mod kernels;
pub mod perplexity;
pub mod plot;
pub mod profile;
pub mod quantize;
pub mod serve;
pub mod trace;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use wllm::EngineConfig;

/// The engine's settings, on every subcommand that starts an engine.
#[derive(Args, Clone, Debug, Default)]
pub struct EngineArgs {
    /// A .gguf file or a Hugging Face directory (default: SmolLM2-135M-Instruct, fetched when missing).
    /// `wllm serve` takes it several times, each as [NAME=]PATH: the first is loaded at start, the others
    /// on their first request (served under NAME, else the file's name).
    #[arg(long, global = true, value_name = "[NAME=]PATH")]
    pub model: Vec<ModelArg>,
    /// Backend: wgpu (WGSL on Vulkan/Metal/DX12), cuda (needs a build with --features cuda), or auto
    /// (cuda when built with it and an NVIDIA device exists, else wgpu).
    #[arg(long, global = true, default_value = "auto")]
    pub device: wllm::Device,
    /// Substring of the wgpu adapter name to use.
    #[arg(long, global = true, env = "WLLM_ADAPTER")]
    pub adapter: Option<String>,
    /// Bytes of GPU memory for the KV cache pool (overrides the memory plan; default: what
    /// --gpu-memory-utilization leaves on a GPU that reports its memory, else 512 MiB).
    #[arg(long, global = true)]
    pub kv_cache_memory: Option<u64>,
    /// Share of the adapter's memory for weights, step buffers and KV pool, as vLLM's (default
    /// 0.9 on GPUs that report their memory; CPU adapters keep the 512 MiB pool unless given).
    #[arg(long, global = true)]
    pub gpu_memory_utilization: Option<f64>,
    /// Speculative decoding, as vLLM's JSON: {"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4, "prompt_lookup_min": 2} (prompt lookup: drafts copied from earlier in
    /// the prompt and output, verified in one step; greedy output unchanged, sampled output verified
    /// by rejection sampling; not for requests with logprobs or penalties). wllm's "adaptive": true
    /// (the default) drafts only what the acceptance rate pays for at the measured step cost.
    #[arg(long, global = true)]
    pub speculative_config: Option<String>,
    /// Speculative decoding with a draft model: a smaller model of the same vocabulary (checked)
    /// drafts tokens the model verifies in one step, with a KV pool of its own. Short for
    /// --speculative-config '{"model": PATH, "num_speculative_tokens": 4}'; with
    /// --speculative-config, sets its "model".
    #[arg(long, global = true)]
    pub draft_model: Option<PathBuf>,
    /// Tokens per KV block.
    #[arg(long, global = true, default_value_t = 16)]
    pub block_size: usize,
    /// Token budget of one engine step (longer prompts are prefilled in chunks of this size).
    #[arg(long, global = true, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step.
    #[arg(long, global = true, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Longest prompt + output (default: the model's context, capped by the KV pool).
    #[arg(long, global = true)]
    pub max_model_len: Option<usize>,
    /// Turn automatic prefix caching off.
    #[arg(long, global = true)]
    pub no_prefix_caching: bool,
    /// Keep every layer's KV in one flat pool even where the model has sliding-window layers
    /// (by default their blocks out of the window go back to the pool: vLLM's hybrid KV cache manager).
    #[arg(long, global = true)]
    pub disable_hybrid_kv_cache_manager: bool,
    /// The KV cache's element type: auto (f16), f32, f16 (half the memory of f32; values rounded to
    /// 11 significant bits as they are written) or q8_0 (llama.cpp's: int8 with a scale per 32 values,
    /// 1.125 bytes a value, keys rotated by a Walsh–Hadamard transform before they are quantised;
    /// heads of a multiple of 32 values).
    #[arg(long, global = true, default_value = "auto", value_parser = parse_kv_dtype, env = "WLLM_KV_CACHE_DTYPE")]
    pub kv_cache_dtype: AutoKvDtype,
    /// Directory of the persisted GPU pipeline cache (default: $XDG_CACHE_HOME/wllm or the platform's).
    #[arg(long, global = true, env = "WLLM_PIPELINE_CACHE_DIR")]
    pub pipeline_cache_dir: Option<PathBuf>,
    /// Compile pipelines every run instead of keeping them on disk.
    #[arg(long, global = true)]
    pub no_pipeline_cache: bool,
    /// WGSL gemm register tiles, for tuning: decode_tn,prefill_tm,prefill_tn,quant_prefill_tm,wg
    /// (default: chosen for the adapter).
    #[arg(long, global = true, env = "WLLM_GEMM_TILES")]
    pub gemm_tiles: Option<wllm::config::GemmTiles>,
    /// cuda: row count from which gemm uses cuBLAS, 0 = never (default 32).
    #[arg(long, global = true, env = "WLLM_CUBLAS_MIN_T")]
    pub cublas_min_t: Option<u32>,
    /// Step time a step with running decodes aims at: its prefill chunk is cut to fit, from the
    /// measured cost of a token. auto = 1.5 x a decode step of every live request; Nx = N times
    /// it (e.g. 2.5x); a number is milliseconds; off = always up to --max-num-batched-tokens.
    #[arg(long, global = true, default_value = "auto", env = "WLLM_STEP_TARGET")]
    pub step_target: wllm::config::StepTarget,
    /// Quantise the weights at load to one of llama.cpp's mixes (Q4_K_M, Q8_0, Q2_K, …), e.g. to run a
    /// Hugging Face directory in less memory; `wllm quantize` writes the result to a file instead.
    #[arg(long, global = true, value_name = "TYPE")]
    pub quantize: Option<wllm::quant::mix::Mix>,
    /// Record every engine step and write them here when the command ends (serve: at shutdown), in
    /// Chrome's Trace Event Format: open in https://ui.perfetto.dev or run `wllm trace FILE -o report.html`.
    #[arg(long, global = true, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Steps a trace keeps: a ring of the most recent, so a long-running server's trace stays bounded.
    #[arg(long, global = true, default_value_t = 20_000)]
    pub trace_steps: usize,
}

/// One `--model` value: `PATH`, or `NAME=PATH` (a name without `/`, and
/// not where the whole value is an existing path).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArg {
    pub name: Option<String>,
    pub path: PathBuf,
}

impl std::str::FromStr for ModelArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse_with(s, |p| p.exists())
    }
}

impl ModelArg {
    /// Parses `s`, where `exists` tells whether a path exists.
    fn parse_with(s: &str, exists: impl Fn(&std::path::Path) -> bool) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty --model: give a .gguf file or a model directory".into());
        }
        let named = s
            .split_once('=')
            .filter(|(n, _)| !n.is_empty() && !n.contains(['/', '\\']) && !exists(std::path::Path::new(s)));
        Ok(match named {
            Some((_, "")) => return Err(format!("--model {s}: no path after the name")),
            Some((name, path)) => ModelArg {
                name: Some(name.into()),
                path: path.into(),
            },
            None => ModelArg {
                name: None,
                path: s.into(),
            },
        })
    }
}

impl EngineArgs {
    /// The model path, fetching the default model when none was given and it
    /// is missing; an error where several were given (only `serve` takes
    /// several: it splits them first, `split_models`).
    pub fn model_path(&self) -> anyhow::Result<PathBuf> {
        match self.model.as_slice() {
            [] => {}
            [one] => return Ok(one.path.clone()),
            more => bail!(
                "--model was given {} times: only `wllm serve` serves several models",
                more.len()
            ),
        }
        let p = wllm::default_model_path();
        if !p.exists() {
            let script = p.parent().map(|d| d.join("fetch.sh")).unwrap_or_default();
            if !script.exists() {
                bail!("no --model given and the default model is missing; pass --model PATH");
            }
            eprintln!("fetching the default model with {} ...", script.display());
            let status = std::process::Command::new("bash")
                .arg(&script)
                .status()
                .context("running fetch.sh")?;
            if !status.success() || !p.exists() {
                bail!(
                    "fetching the default model failed; run {} by hand or pass --model PATH",
                    script.display()
                );
            }
        }
        Ok(p)
    }

    /// These settings with only the first model, and the other models given.
    pub fn split_models(&self) -> (EngineArgs, Vec<ModelArg>) {
        let mut first = self.clone();
        let rest = first.model.split_off(first.model.len().min(1));
        (first, rest)
    }

    pub fn config(&self) -> anyhow::Result<EngineConfig> {
        Ok(EngineConfig {
            model: self.model_path()?,
            device: self.device,
            adapter: self.adapter.clone(),
            kv_cache_memory: self.kv_cache_memory,
            gpu_memory_utilization: self.gpu_memory_utilization,
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            max_model_len: self.max_model_len,
            enable_prefix_caching: !self.no_prefix_caching,
            hybrid_kv_cache: !self.disable_hybrid_kv_cache_manager,
            kv_cache_dtype: self.kv_cache_dtype,
            pipeline_cache: match (&self.pipeline_cache_dir, self.no_pipeline_cache) {
                (_, true) => wllm::config::PipelineCacheDir::Off,
                (Some(d), false) => wllm::config::PipelineCacheDir::At(d.clone()),
                (None, false) => wllm::config::PipelineCacheDir::User,
            },
            gemm_tiles: self.gemm_tiles,
            cublas_min_t: self.cublas_min_t,
            step_target: self.step_target,
            quantize: self.quantize,
            trace_steps: if self.trace.is_some() {
                self.trace_steps.max(1)
            } else {
                0
            },
            speculative: self.speculative()?,
        })
    }

    /// The speculative decoding settings of --speculative-config and --draft-model.
    fn speculative(&self) -> anyhow::Result<Option<wllm::config::SpeculativeConfig>> {
        use wllm::config::SpeculativeConfig;
        let given = match &self.speculative_config {
            Some(s) => Some(SpeculativeConfig::parse(s).map_err(anyhow::Error::msg)?),
            None => None,
        };
        Ok(match (given, &self.draft_model) {
            (given, None) => given,
            (None, Some(path)) => Some(SpeculativeConfig::draft_model(path, 4)),
            (Some(mut c), Some(path)) => {
                if c.model.as_ref().is_some_and(|m| m != path) || (c.method != "draft_model" && c.method != "ngram") {
                    anyhow::bail!("--draft-model and --speculative-config name different drafters: give one of them");
                }
                c.method = "draft_model".into();
                c.model = Some(path.clone());
                c.check().map_err(anyhow::Error::msg)?;
                Some(c)
            }
        })
    }

    /// Starts an engine and prints what it runs on.
    pub fn start(&self) -> anyhow::Result<wllm::Engine> {
        self.start_with(Warm::No, 0)
    }

    /// As `start`, for an engine that waits on a person first (`wllm chat`):
    /// its thread builds the pipelines of short prompts meanwhile
    /// (`Engine::from_core_primed`).
    pub fn start_primed(&self) -> anyhow::Result<wllm::Engine> {
        self.start_with(Warm::Prime, 0)
    }

    /// As `start`, for a server: also builds every pipeline its first requests
    /// will need (`LlmEngine::warm_up`) before it returns.
    pub fn start_warm(&self) -> anyhow::Result<wllm::Engine> {
        self.start_with(Warm::Full, 0)
    }

    /// As `start_warm`, keeping at least `steps` steps of trace for the live
    /// /engine page even without --trace.
    pub fn start_server(&self, steps: usize) -> anyhow::Result<wllm::Engine> {
        self.start_with(Warm::Full, steps)
    }

    fn start_with(&self, warm: Warm, min_trace_steps: usize) -> anyhow::Result<wllm::Engine> {
        let mut cfg = self.config()?;
        cfg.trace_steps = cfg.trace_steps.max(min_trace_steps);
        if cfg.device == wllm::Device::Auto
            && wllm::backend::device::CUDA_BUILT
            && let Some(why) = wllm::backend::device::cuda_unavailable()
        {
            eprintln!("cuda backend not used ({why}); running on wgpu");
        }
        let t0 = std::time::Instant::now();
        let mut core =
            wllm::LlmEngine::new(&cfg).with_context(|| format!("starting the engine on {}", cfg.model.display()))?;
        if warm == Warm::Full {
            let t = std::time::Instant::now();
            let steps = core.warm_up().context("warming up the engine's pipelines")?;
            eprintln!(
                "warmed up the pipelines in {steps} steps, {:.1} s",
                t.elapsed().as_secs_f64()
            );
            if let Some(r) = &core.row_tile {
                eprintln!("{}", r.describe());
            }
        }
        if let Some(d) = &core.draft {
            eprintln!("{}", d.describe());
        }
        let engine = if warm == Warm::Prime {
            wllm::Engine::from_core_primed(core)
        } else {
            wllm::Engine::from_core(core)
        };
        eprintln!("device: {}", engine.adapter());
        eprintln!("{}", engine.memory_plan().describe());
        eprintln!("{}", engine.kv_plan().describe());
        eprintln!(
            "loaded {} in {:.1} s ({})",
            cfg.model.display(),
            t0.elapsed().as_secs_f64(),
            engine.load_timings().describe()
        );
        Ok(engine)
    }
}

/// What an engine does before its first request (`EngineArgs::start_with`).
#[derive(Clone, Copy, PartialEq)]
enum Warm {
    /// Nothing: the first prompt compiles what it runs.
    No,
    /// Builds short prompts' pipelines on the engine thread, in the background.
    Prime,
    /// The full warm-up (`LlmEngine::warm_up`) before returning: servers.
    Full,
}

impl EngineArgs {
    /// Writes the engine's trace to `--trace FILE`, when given.
    pub fn write_trace(&self, engine: &wllm::Engine) -> anyhow::Result<()> {
        let Some(path) = &self.trace else {
            return Ok(());
        };
        let trace = engine.trace().context("taking the step trace")?;
        let steps = trace["otherData"]["steps_recorded"].as_u64().unwrap_or(0);
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, serde_json::to_vec(&trace)?).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "trace: {steps} steps written to {} (open it in https://ui.perfetto.dev, or `wllm trace {} -o report.html`)",
            path.display(),
            path.display()
        );
        Ok(())
    }
}

/// Sampling flags shared by generate and chat: the library's parameter list
/// (`SamplingOverrides`, the same fields as the server's request bodies) over
/// greedy decoding with no token limit.
#[derive(Args, Clone, Debug, Default)]
pub struct SamplingArgs {
    #[command(flatten)]
    pub sampling: wllm::sampling::SamplingOverrides,
}

impl SamplingArgs {
    pub fn params(&self) -> wllm::SamplingParams {
        self.sampling.apply(wllm::SamplingParams {
            max_tokens: None,
            ..wllm::SamplingParams::greedy()
        })
    }
}

/// `--kv-cache-dtype`'s value: `None` for auto. An alias, so that clap takes
/// the parser's `Option` as the value rather than as "flag may be absent".
pub type AutoKvDtype = Option<wllm::config::KvDtype>;

/// `--kv-cache-dtype`: auto (the engine's default) or a `KvDtype`.
fn parse_kv_dtype(s: &str) -> Result<Option<wllm::config::KvDtype>, String> {
    match s {
        "auto" => Ok(None),
        _ => s.parse().map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::ModelArg;

    fn arg(s: &str) -> Result<ModelArg, String> {
        s.parse()
    }

    #[test]
    fn a_model_arg_is_a_path_or_a_name_and_a_path() {
        assert_eq!(
            arg("models/a.gguf").unwrap(),
            ModelArg {
                name: None,
                path: "models/a.gguf".into()
            }
        );
        assert_eq!(
            arg("qwen=models/q=1.gguf").unwrap(),
            ModelArg {
                name: Some("qwen".into()),
                path: "models/q=1.gguf".into()
            }
        );
        // A `/` before the `=`: a path with `=` in it, not a name.
        assert_eq!(arg("dir/a=b.gguf").unwrap().name, None);
        assert!(arg("qwen=").is_err(), "a name needs a path");
        assert!(arg("").is_err());
        // An existing file whose name has `=` is that file.
        let exists = |p: &std::path::Path| p == std::path::Path::new("x=y.gguf");
        assert_eq!(ModelArg::parse_with("x=y.gguf", exists).unwrap().name, None);
        assert_eq!(
            ModelArg::parse_with("x=z.gguf", exists).unwrap().name.as_deref(),
            Some("x")
        );
    }

    #[test]
    fn only_serve_takes_several_models() {
        let a = super::EngineArgs {
            model: vec![arg("a.gguf").unwrap(), arg("b=c.gguf").unwrap()],
            ..Default::default()
        };
        let e = a.model_path().unwrap_err().to_string();
        assert!(e.contains("only `wllm serve`"), "{e}");
        let (first, rest) = a.split_models();
        assert_eq!(first.model_path().unwrap(), std::path::PathBuf::from("a.gguf"));
        assert_eq!(rest, vec![arg("b=c.gguf").unwrap()]);
    }
}
