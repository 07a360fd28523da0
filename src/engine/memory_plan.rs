//! The memory plan made at start, before any weight is read: the weights'
//! resident bytes (counted from the file's tensor shapes), the step buffers'
//! bytes, and what that leaves the KV pool of the adapter's memory, as vLLM's
//! `--gpu-memory-utilization` means it. `KvPlan` then turns the pool's bytes
//! into blocks; `wllm info` prints the same plan without loading.
//!
//! Where the pool's bytes come from, first match:
//! 1. `--kv-cache-memory`: as given (refused where the whole does not fit
//!    the adapter's reported memory);
//! 2. the adapter reports its memory (Vulkan heap or budget, CUDA's free
//!    memory) and `--gpu-memory-utilization` is given, or the adapter is a
//!    GPU of its own (not a CPU adapter, whose "device memory" is the host's
//!    RAM shared with everything else): utilization × memory − weights − step
//!    buffers, capped at what `max_num_seqs` sequences of the longest context
//!    can fill (a desktop app has no use for the rest);
//! 3. else the fixed default, 512 MiB.
//!
//! The weights alone (with the step buffers) not fitting is refused here,
//! before loading, with the figures. CPU adapters are not held to the heap
//! they report unless given a share (lavapipe's is a fixed 2 GiB, where its
//! allocations are the host's malloc).

use super::config::DEFAULT_KV_CACHE_MEMORY;
use crate::gpu::DeviceMemory;
use crate::model::{ModelConfig, ModelFiles};

/// vLLM's default share of the device memory one engine takes.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// Where the KV pool's bytes came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvSizing {
    /// `--kv-cache-memory`.
    Given,
    /// `--gpu-memory-utilization` of the adapter's memory.
    Utilization,
    /// Utilization, capped at what the sequences can fill.
    Capped,
    /// The fixed default (the adapter reports no memory, or is a CPU adapter).
    Default,
}

/// The inputs of the plan other than the model.
#[derive(Clone, Copy, Debug)]
pub struct MemoryInputs {
    pub device: Option<DeviceMemory>,
    /// Whether the adapter's memory is the host's (CPU adapters).
    pub cpu_adapter: bool,
    pub kv_cache_memory: Option<u64>,
    pub gpu_memory_utilization: Option<f64>,
    /// KV bytes beyond which the pool holds nothing more any sequence could
    /// use (max_num_seqs sequences of the longest context, flat layout).
    pub kv_useful: u64,
}

/// The start-up plan: weights / step buffers / KV bytes of the adapter's memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    /// Resident weight bytes (with rope tables), counted from the tensor shapes.
    pub weights: u64,
    /// Step buffers: activations, logits, ids and block tables.
    pub activations: u64,
    /// Bytes asked of the KV pool (`KvPlan` rounds them down to whole blocks).
    pub kv: u64,
    pub sizing: KvSizing,
    pub device: Option<DeviceMemory>,
    /// The share of the device memory applied (sizings Utilization and Capped).
    pub utilization: Option<f64>,
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

impl MemoryPlan {
    /// Weights, step buffers and KV pool together.
    pub fn total(&self) -> u64 {
        self.weights + self.activations + self.kv
    }

    /// Plans the pool for `weights` and `activations` bytes.
    pub fn new(weights: u64, activations: u64, inp: &MemoryInputs) -> Result<Self, String> {
        if let Some(u) = inp.gpu_memory_utilization
            && !(u > 0.0 && u <= 1.0)
        {
            return Err(format!("--gpu-memory-utilization must be in (0, 1], got {u}"));
        }
        let fixed = weights + activations;
        let plan = |kv, sizing, utilization| Self {
            weights,
            activations,
            kv,
            sizing,
            device: inp.device,
            utilization,
        };
        // A CPU adapter's heap is advisory: used only when asked for a share.
        let device = inp
            .device
            .filter(|_| !inp.cpu_adapter || inp.gpu_memory_utilization.is_some());
        let Some(dev) = device else {
            if inp.gpu_memory_utilization.is_some() && inp.kv_cache_memory.is_none() {
                return Err(
                    "--gpu-memory-utilization needs the adapter's memory size, which this adapter does not report: \
                     size the pool with --kv-cache-memory instead"
                        .into(),
                );
            }
            let kv = inp.kv_cache_memory.unwrap_or(DEFAULT_KV_CACHE_MEMORY);
            let sizing = if inp.kv_cache_memory.is_some() {
                KvSizing::Given
            } else {
                KvSizing::Default
            };
            return Ok(plan(kv, sizing, None));
        };
        let usable = dev.usable();
        let what = |total: u64| {
            format!(
                "the weights ({}) and step buffers ({}) need {}{}",
                mib(weights),
                mib(activations),
                mib(fixed),
                if total > fixed {
                    format!(" and the KV pool {}", mib(total - fixed))
                } else {
                    String::new()
                }
            )
        };
        let fix = "use a smaller quantisation (`wllm quantize IN OUT Q4_K_M`), lower --max-num-batched-tokens or \
                   --max-num-seqs";
        if let Some(kv) = inp.kv_cache_memory {
            if fixed + kv > usable {
                return Err(format!(
                    "{}: more than the {} this adapter has free; {fix}, or lower --kv-cache-memory",
                    what(fixed + kv),
                    mib(usable)
                ));
            }
            return Ok(plan(kv, KvSizing::Given, None));
        }
        let util = inp.gpu_memory_utilization.unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION);
        let limit = (usable as f64 * util) as u64;
        if fixed >= limit {
            return Err(format!(
                "{}: more than the {} that --gpu-memory-utilization {util} leaves of the {} this adapter has free; \
                 {fix}, or raise --gpu-memory-utilization",
                what(fixed),
                mib(limit),
                mib(usable)
            ));
        }
        let kv = limit - fixed;
        if kv > inp.kv_useful {
            Ok(plan(inp.kv_useful, KvSizing::Capped, Some(util)))
        } else {
            Ok(plan(kv, KvSizing::Utilization, Some(util)))
        }
    }

    /// The start-up line (vLLM prints the same figures over several lines).
    pub fn describe(&self) -> String {
        let of = match self.device {
            Some(d) => {
                let free = match d.available {
                    Some(a) => format!(", {} free", mib(a)),
                    None => String::new(),
                };
                format!(" of the adapter's {}{free}", mib(d.total))
            }
            None => " (the adapter reports no memory size)".into(),
        };
        let how = match (self.sizing, self.utilization) {
            (KvSizing::Given, _) => "KV pool as --kv-cache-memory gave".to_string(),
            (KvSizing::Utilization, Some(u)) => format!("KV pool from --gpu-memory-utilization {u}"),
            (KvSizing::Capped, Some(u)) => {
                format!("KV pool from --gpu-memory-utilization {u}, capped at what --max-num-seqs sequences can fill")
            }
            _ => "the default KV pool".to_string(),
        };
        format!(
            "memory plan: weights {} + step buffers {} + KV {} = {}{of}; {how}",
            mib(self.weights),
            mib(self.activations),
            mib(self.kv),
            mib(self.weights + self.activations + self.kv)
        )
    }
}

/// Resident bytes of a model's weights, from its tensor shapes: each matrix
/// in its device layout (`quant::resident_bytes`), vectors (norms, biases)
/// in f32, and a rope table of `positions` rows for each distinct rope base.
pub fn weight_bytes(files: &ModelFiles, cfg: &ModelConfig, positions: usize, narrow: bool) -> u64 {
    let tensors: u64 = files
        .tensor_shapes()
        .into_iter()
        .map(|(format, rows, cols)| {
            if rows <= 1 {
                cols as u64 * 4
            } else {
                crate::quant::resident_bytes(format, rows, cols, narrow)
            }
        })
        .sum();
    let mut thetas: Vec<f64> = (0..cfg.layers).map(|l| cfg.rope_theta_of(l)).collect();
    thetas.sort_by(f64::total_cmp);
    thetas.dedup();
    tensors + (thetas.len() * positions * cfg.head_dim * 4) as u64
}

/// Bytes of the step buffers `StepBuffers::new` allocates for these sizes.
pub fn step_buffer_bytes(
    cfg: &ModelConfig,
    max_tokens: usize,
    max_seqs: usize,
    max_blocks: usize,
    kv_groups: usize,
) -> u64 {
    let (t, s, h) = (max_tokens, max_seqs, cfg.hidden);
    let ids = 3 * t + kv_groups * (t + s * max_blocks) + 4 * s + s * cfg.vocab.div_ceil(32);
    let post = if cfg.spec.post_norms { t * h } else { 0 };
    let act = 3 * t * h
        + t * cfg.qkv_width()
        + t * cfg.heads * cfg.head_dim
        + 3 * t * cfg.intermediate
        + s * h
        + s * cfg.vocab
        + s
        + post;
    4 * (ids + act) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn inputs(device: Option<DeviceMemory>) -> MemoryInputs {
        MemoryInputs {
            device,
            cpu_adapter: false,
            kv_cache_memory: None,
            gpu_memory_utilization: None,
            kv_useful: u64::MAX,
        }
    }

    fn gpu(total: u64, available: Option<u64>) -> Option<DeviceMemory> {
        Some(DeviceMemory { total, available })
    }

    #[test]
    fn a_gpu_gives_the_pool_its_share_less_the_weights() {
        // An 8 GiB card, 7.5 GiB free: 0.9 x 7.5 GiB - 4.5 GiB - 0.5 GiB.
        let p = MemoryPlan::new(9 * GIB / 2, GIB / 2, &inputs(gpu(8 * GIB, Some(15 * GIB / 2)))).unwrap();
        assert_eq!(p.sizing, KvSizing::Utilization);
        assert_eq!(p.kv, (15 * GIB / 2) * 9 / 10 - 5 * GIB);
        let mut inp = inputs(gpu(8 * GIB, None));
        inp.gpu_memory_utilization = Some(0.75);
        let p = MemoryPlan::new(4 * GIB, 0, &inp).unwrap();
        assert_eq!(p.kv, 2 * GIB);
        assert!(
            p.describe().contains("--gpu-memory-utilization 0.75"),
            "{}",
            p.describe()
        );
        inp.kv_useful = GIB;
        let p = MemoryPlan::new(4 * GIB, 0, &inp).unwrap();
        assert_eq!((p.kv, p.sizing), (GIB, KvSizing::Capped));
    }

    #[test]
    fn weights_that_do_not_fit_are_refused_with_the_figures() {
        let e = MemoryPlan::new(7 * GIB, GIB / 2, &inputs(gpu(8 * GIB, None))).unwrap_err();
        assert!(e.contains("7168.0 MiB") && e.contains("7372.8 MiB"), "{e}");
        let mut inp = inputs(gpu(8 * GIB, None));
        inp.kv_cache_memory = Some(2 * GIB);
        let e = MemoryPlan::new(6 * GIB + 1, 0, &inp).unwrap_err();
        assert!(e.contains("--kv-cache-memory"), "{e}");
        inp.kv_cache_memory = Some(GIB);
        assert_eq!(MemoryPlan::new(6 * GIB, 0, &inp).unwrap().kv, GIB);
    }

    #[test]
    fn cpu_adapters_and_silent_adapters_keep_the_default() {
        let mut inp = inputs(gpu(24 * GIB, None));
        inp.cpu_adapter = true;
        let p = MemoryPlan::new(GIB, 0, &inp).unwrap();
        assert_eq!((p.kv, p.sizing), (DEFAULT_KV_CACHE_MEMORY, KvSizing::Default));
        // Its heap is not held against it (lavapipe reports a fixed 2 GiB).
        let small = MemoryInputs {
            device: gpu(GIB, None),
            ..inp
        };
        assert_eq!(MemoryPlan::new(2 * GIB, 0, &small).unwrap().kv, DEFAULT_KV_CACHE_MEMORY);
        inp.gpu_memory_utilization = Some(0.5);
        assert_eq!(MemoryPlan::new(GIB, 0, &inp).unwrap().kv, 11 * GIB);
        let p = MemoryPlan::new(GIB, 0, &inputs(None)).unwrap();
        assert_eq!((p.kv, p.sizing), (DEFAULT_KV_CACHE_MEMORY, KvSizing::Default));
        let mut silent = inputs(None);
        silent.gpu_memory_utilization = Some(0.9);
        assert!(
            MemoryPlan::new(GIB, 0, &silent)
                .unwrap_err()
                .contains("--kv-cache-memory")
        );
        for bad in [0.0, 1.5, f64::NAN] {
            silent.gpu_memory_utilization = Some(bad);
            assert!(MemoryPlan::new(GIB, 0, &silent).is_err(), "{bad}");
        }
    }
}
