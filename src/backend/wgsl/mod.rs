//! `Kernels`: every WGSL pipeline of the wgpu backend, and the choice of
//! variant (tile shapes, attention shape) per adapter. The ops themselves are
//! `Backend` methods (ops.rs); the fixed kernels come from the device's
//! `PipelineStore` at creation, gemm, embed and attention variants the first
//! time a step needs them.

pub mod attention;
pub mod dequant_roof;
mod dump;
pub mod embed;
pub mod gemm;
mod gemm_ops;
mod gemm_tex;
mod kv_tex;
mod ops;
pub mod roofs;
pub mod templates;
mod weight;

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

pub use dump::RenderedKernel;
pub use gemm::{GemmParams, GemmVariant};
pub use templates::SHADER_FILES;
pub use weight::{GpuWeight, Residency, TexLayout, WeightTex, WeightWindow};

pub use crate::backend::{RopeArgs, RopePairing};

/// Activation rows in a wgpu buffer.
pub type Rows<'a> = crate::backend::Rows<'a, wgpu::Buffer>;
/// The paged KV cache in wgpu buffers.
pub type PagedKv<'a> = crate::backend::PagedKv<'a, wgpu::Buffer>;

use crate::backend::KvDtype;
use crate::gpu::{BindCache, Binding, Bound, BufSlice, GpuContext, GpuError, Kernel, PipelineStats, PipelineStore};
use crate::quant::WeightFormat;

pub use crate::config::GemmTiles;

/// The tiles for an adapter class: `GemmTiles::cpu()` on software adapters, else `gpu()`.
pub fn tiles_for(ctx: &GpuContext) -> GemmTiles {
    if ctx.is_cpu() {
        GemmTiles::cpu()
    } else {
        GemmTiles::gpu()
    }
}

/// The device's pipeline store, keyed by this backend's shader files.
pub fn pipeline_store(ctx: &GpuContext) -> Arc<PipelineStore> {
    let sources: Vec<&str> = SHADER_FILES.iter().map(|(_, s)| *s).collect();
    ctx.pipelines(&sources)
}

/// Every pipeline of the engine.
pub struct Kernels {
    pub ctx: GpuContext,
    /// The device's compiled pipelines, shared with every other `Kernels` on it.
    store: Arc<PipelineStore>,
    pub tiles: GemmTiles,
    /// Kernel shapes for CPU adapters (lavapipe) rather than GPUs.
    pub cpu_shapes: bool,
    /// Fewest workgroups a batched gemm should launch: on CPU adapters a
    /// workgroup is one thread's share of a dispatch, so a narrow weight at a
    /// small batch (the o and down gemms at 16 rows: 3 workgroups) leaves
    /// cores idle, and `row_tile` takes a smaller row tile below it; on GPUs
    /// (`GPU_MIN_WORKGROUPS`) the column tile narrows instead (`pass_tn`).
    /// `use_gpu_shapes` sets 1, so that tests run the tiles they name.
    pub min_workgroups: u32,
    /// The largest row tile batched gemms may take (`u32::MAX`: the tiles'
    /// own), set by an engine (`Backend::set_row_tile_cap`): the smallest cap
    /// at start, then its warm-up's choice from timed steps.
    row_cap: AtomicU32,
    /// Whether the tiles were given (`--gemm-tiles`): then nothing is tuned.
    tiles_given: bool,
    pub(crate) rms_norm: Arc<Kernel>,
    pub(crate) rope: Arc<Kernel>,
    pub(crate) rope_cache_write: Arc<Kernel>,
    pub(crate) act_mul: Arc<Kernel>,
    /// The ops only some architectures run (bias_add, head_norm,
    /// elementwise), compiled on first use so that a Llama never builds them.
    arch_ops: Mutex<HashMap<&'static str, Arc<Kernel>>>,
    /// argmax by workgroup size (`argmax_wg`), compiled on first use.
    argmax: Mutex<HashMap<u32, Arc<Kernel>>>,
    pub(crate) masked_argmax: Arc<Kernel>,
    /// cache_write, by (cache as textures, dtype), compiled on first use.
    pub(crate) cache_write: Mutex<HashMap<(bool, KvDtype), Arc<Kernel>>>,
    attention: Mutex<HashMap<attention::AttentionVariant, Arc<Kernel>>>,
    gemm: Mutex<HashMap<GemmVariant, Arc<Kernel>>>,
    /// Textures gemm copies x rows into on CPU adapters, one per (buffer, row stride).
    /// (Their views are kept too: a step's bind groups are reused only for the same view.)
    x_tex: Mutex<HashMap<(wgpu::Buffer, u32), (wgpu::Texture, wgpu::TextureView)>>,
    /// rms_norm weights as one-row textures, by (buffer, length), for the gemms' norm prologue.
    norm_tex: Mutex<HashMap<(wgpu::Buffer, u32), wgpu::TextureView>>,
    embed: Mutex<HashMap<(WeightFormat, bool), Arc<Kernel>>>,
    /// The KV caches held as textures (CPU adapters), by the placeholder buffer
    /// `Backend::kv_cache` returned for each (kv_tex.rs).
    kv_tex: Mutex<HashMap<wgpu::Buffer, kv_tex::KvTexture>>,
    /// Largest byte range one storage binding may cover (weights beyond it are
    /// bound window by window).
    pub binding_limit: u64,
    // dummy, dummy_rw: 16-byte buffers bound where a kernel ignores a binding
    pub(crate) dummy: wgpu::Buffer,
    pub(crate) dummy_rw: wgpu::Buffer,
    /// Bind groups of the steps recorded through the `Backend` interface (the
    /// engine's), reused across steps.
    pub bind_cache: Arc<Mutex<BindCache>>,
}

use Binding::{Read as R, ReadWrite as RW};

impl Kernels {
    /// Compiles the fixed kernels (or takes them from the device's store); gemm,
    /// embed and attention variants are compiled when first used. Gemm tiles
    /// are the adapter's (`tiles_for`).
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        Self::with_tiles(ctx, None)
    }

    /// As `new`, with the gemm tiles given (`None`: the adapter's).
    pub fn with_tiles(ctx: &GpuContext, tiles: Option<GemmTiles>) -> Result<Self, GpuError> {
        let store = pipeline_store(ctx);
        let k = |name: &str, src: &str, b: &[Binding]| store.kernel(&ctx.device, name, src, b);
        let dummy = || {
            ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("dummy"),
                contents: &[0u8; 16],
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        let me = Self {
            binding_limit: ctx.max_binding(),
            ctx: ctx.clone(),
            tiles: tiles.unwrap_or_else(|| tiles_for(ctx)),
            cpu_shapes: ctx.cpu_textures(),
            min_workgroups: if ctx.is_cpu() {
                cpu_min_workgroups()
            } else {
                GPU_MIN_WORKGROUPS
            },
            row_cap: AtomicU32::new(u32::MAX),
            tiles_given: tiles.is_some(),
            rms_norm: k("rms_norm", templates::file("rms_norm.wgsl"), &[R, R, RW, R, RW])?,
            rope: k("rope", templates::file("rope.wgsl"), &[R, R, RW])?,
            rope_cache_write: k(
                "rope_cache_write",
                templates::file("rope_cache_write.wgsl"),
                &[R, R, R, RW, RW, RW],
            )?,
            act_mul: k("act_mul", templates::file("act_mul.wgsl"), &[R, RW])?,
            arch_ops: Mutex::default(),
            argmax: Mutex::default(),
            masked_argmax: k("masked_argmax", templates::file("masked_argmax.wgsl"), &[R, R, R, RW])?,
            cache_write: Mutex::default(),
            attention: Mutex::default(),
            gemm: Mutex::default(),
            x_tex: Mutex::default(),
            norm_tex: Mutex::default(),
            embed: Mutex::default(),
            kv_tex: Mutex::default(),
            dummy: dummy(),
            dummy_rw: dummy(),
            bind_cache: BindCache::shared(),
            store: store.clone(),
        };
        Ok(me)
    }

    /// argmax's workgroup size: 64 lanes on CPU adapters, 256 on GPUs (the
    /// H200's one-row decode step spent 7 % of its time in a 64-lane scan of
    /// the 49,152 logits).
    pub fn argmax_wg(&self) -> u32 {
        if self.cpu_shapes { 64 } else { 256 }
    }

    /// The argmax kernel of this adapter's workgroup size (`argmax_wg`).
    pub(crate) fn argmax_kernel(&self) -> Result<Arc<Kernel>, GpuError> {
        let wg = self.argmax_wg();
        variant_kernel(&self.argmax, wg, || {
            let src = templates::render("argmax.wgsl", minijinja::context! { wg => wg })?;
            self.store
                .kernel(&self.ctx.device, &format!("argmax_{wg}"), &src, &[R, RW])
        })
    }

    /// `cache_write` into a cache of `dtype`, held as textures (`tex`) or a buffer.
    pub(crate) fn cache_write_kernel(&self, tex: bool, dtype: KvDtype) -> Result<Arc<Kernel>, GpuError> {
        variant_kernel(&self.cache_write, (tex, dtype), || {
            let (name, src) = cache_write_source(tex, dtype)?;
            let bindings = if tex {
                let st = kv_tex::store_binding(dtype);
                [R, R, st, st]
            } else {
                [R, R, RW, RW]
            };
            self.store.kernel(&self.ctx.device, &name, &src, &bindings)
        })
    }

    /// One of the ops only some architectures run (`ARCH_OPS`), compiled on first use.
    pub(crate) fn arch_kernel(&self, name: &'static str) -> Result<Arc<Kernel>, GpuError> {
        let bindings: &[Binding] = match name {
            "elementwise" => &[RW],
            _ => &[R, RW],
        };
        variant_kernel(&self.arch_ops, name, || {
            self.store.kernel(
                &self.ctx.device,
                name,
                templates::file(&format!("{name}.wgsl")),
                bindings,
            )
        })
    }

    /// Pipelines compiled on this device in this process, and the time it took.
    pub fn pipeline_stats(&self) -> PipelineStats {
        self.store.stats()
    }

    /// Persists newly compiled pipelines (see `PipelineStore::save_if_dirty`).
    pub fn save_pipelines(&self) {
        self.store.save_if_dirty();
    }

    pub(crate) fn storage_align(&self) -> u64 {
        u64::from(self.ctx.limits.min_storage_buffer_offset_alignment).max(4)
    }

    /// Uses the kernel shapes chosen for GPUs whatever the adapter (tests run the
    /// GPU variants on lavapipe this way).
    pub fn use_gpu_shapes(&mut self) {
        self.tiles = GemmTiles::gpu();
        self.cpu_shapes = false;
        self.min_workgroups = 1;
    }

    /// Uses the kernel shapes chosen for CPU adapters whatever the adapter
    /// (tests run the CPU variants, the fused norms among them, on GPUs this way).
    pub fn use_cpu_shapes(&mut self) {
        self.tiles = GemmTiles::cpu();
        self.cpu_shapes = true;
        self.min_workgroups = cpu_min_workgroups();
    }

    /// A zeroed storage buffer of `bytes`.
    pub fn scratch(&self, bytes: u64) -> wgpu::Buffer {
        self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("scratch"),
            size: bytes.max(16).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// The `embed` variant for a format, reading buffers or (`tex`) textures.
    pub(crate) fn embed_kernel(&self, f: WeightFormat, tex: bool) -> Result<Arc<Kernel>, GpuError> {
        variant_kernel(&self.embed, (f, tex), || {
            let name = format!("embed_{f:?}{}", if tex { "_tex" } else { "" });
            self.store.kernel(
                &self.ctx.device,
                &name,
                &embed::source(f, tex)?,
                &embed::bindings(f, tex),
            )
        })
    }

    /// The `paged_attention` variant for a head shape, a step of `t` tokens
    /// and at most `max_query_len` of one sequence: on CPU adapters a
    /// workgroup serves every query head of a KV head (each K/V row loaded once).
    pub(crate) fn attention_variant(
        &self,
        head_dim: u32,
        group: u32,
        t: u32,
        max_query_len: u32,
    ) -> attention::AttentionVariant {
        // Workgroup memory: W·G lanes of (HD accumulators + max + sum), f32.
        let fits = |w: u32, g: u32| {
            u64::from(w * g * (head_dim + 2) * 4) <= u64::from(self.ctx.limits.max_compute_workgroup_storage_size)
        };
        let (mut w, mut g) = if self.cpu_shapes {
            let mut g = group.max(1);
            while g > 1 && (g * head_dim > 512 || !group.is_multiple_of(g)) {
                g -= 1;
            }
            (8, g)
        } else {
            ((2048 / head_dim).clamp(4, 32), 1)
        };
        while !fits(w, g) && g > 1 {
            g -= 1;
            while !group.is_multiple_of(g) {
                g -= 1;
            }
        }
        while !fits(w, g) && w > 1 {
            w /= 2;
        }
        // On CPU adapters, steps of many tokens (prefill chunks) give a
        // workgroup 4 tokens, which share each K/V row it loads when of one
        // sequence (a 512-token prefill's attention: 1.12 -> 0.71 s in
        // `wllm profile`); decode-sized steps, and steps of decodes only,
        // keep one token a workgroup.
        // The tile's q and accumulators are registers (qt·g·head_dim floats
        // each, unrolled): bounded so the kernel stays quick to compile.
        let qt = if self.cpu_shapes && t >= 64 && max_query_len >= 16 {
            (768 / (g * head_dim).max(1)).clamp(1, 4)
        } else {
            1
        };
        // Lanes that are one subgroup merge without workgroup memory (whose
        // lane-varying loads and stores llvmpipe runs lane by lane).
        let subgroups = self.cpu_shapes
            && self.ctx.features.contains(wgpu::Features::SUBGROUP)
            && self.ctx.info.subgroup_min_size >= w;
        // Lanes of one subgroup (CPU adapters): keys in blocks of W, and
        // steps with a prefill chunk a tile of W tokens a workgroup whose
        // lanes share each block's K/V rows by broadcast (a 512-token
        // prefill's attention: see the README's profile). The tile serves
        // W consecutive tokens of one sequence; a tile of mixed sequences
        // runs them one after the other, so a step of decodes only (however
        // many) keeps one token a workgroup: the tile only where a sequence
        // brings at least 4 tiles' worth of tokens.
        let blocked = subgroups && w == 8 && head_dim.is_multiple_of(4);
        let qt = match blocked {
            true if t >= 64 && max_query_len >= 4 * w && g * head_dim <= 512 => w,
            true => 1,
            false => qt,
        };
        attention::AttentionVariant {
            head_dim,
            w,
            g,
            qt,
            kv_tex: false,
            subgroups,
            blocked,
            f16: false,
            q8: false,
            window: false,
            softcap: false,
        }
    }

    pub(crate) fn attention_kernel(&self, v: attention::AttentionVariant) -> Result<Arc<Kernel>, GpuError> {
        variant_kernel(&self.attention, v, || {
            let kv = if v.kv_tex { "_kvtex" } else { "" };
            let sg = if v.subgroups { "_sg" } else { "" };
            let blk = if v.blocked { "_blocked" } else { "" };
            let half = if v.f16 {
                "_f16"
            } else if v.q8 {
                "_q8_0"
            } else {
                ""
            };
            let name = format!(
                "paged_attention_{}x{}x{}x{}{kv}{sg}{blk}{half}",
                v.head_dim, v.w, v.g, v.qt
            );
            let tex = kv_tex::load_binding(if v.f16 { KvDtype::F16 } else { KvDtype::F32 });
            let storage = if v.kv_tex {
                [R, tex, tex, R, R, R, RW]
            } else {
                [R, R, R, R, R, R, RW]
            };
            self.store
                .kernel(&self.ctx.device, &name, &attention::source(v)?, &storage)
        })
    }
}

/// The name and WGSL of `cache_write` for a cache of `dtype` held as
/// textures (`tex`: cache_write_tex.wgsl) or a buffer (cache_write.wgsl).
pub(crate) fn cache_write_source(tex: bool, dtype: KvDtype) -> Result<(String, String), GpuError> {
    let file = if tex { "cache_write_tex" } else { "cache_write" };
    let src = templates::render(
        &format!("{file}.wgsl"),
        minijinja::context! {
            f16 => dtype == KvDtype::F16,
            q8 => dtype == KvDtype::Q8_0,
            kv_texel => kv_tex::wgsl_texel(dtype),
        },
    )?;
    Ok((format!("{file}_{dtype}"), src))
}

/// The kernel of variant `key` from `map`, made by `make` on first use. The
/// map is not locked while `make` compiles, so threads compile different
/// variants at once (tests and warm-ups on several cores); two threads that
/// want the same variant get one pipeline, as `PipelineStore::kernel`
/// compiles each source once.
pub(crate) fn variant_kernel<K: std::hash::Hash + Eq>(
    map: &Mutex<HashMap<K, Arc<Kernel>>>,
    key: K,
    make: impl FnOnce() -> Result<Arc<Kernel>, GpuError>,
) -> Result<Arc<Kernel>, GpuError> {
    let lock = || map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = lock().get(&key) {
        return Ok(k.clone());
    }
    let k = make()?;
    Ok(lock().entry(key).or_insert(k).clone())
}

/// `Kernels::min_workgroups` on GPUs: about two a multiprocessor of a large
/// GPU (an H200 has 132). On an H200 a 16-row decode step's batched gemms
/// were fastest with their column tile narrowed to 1-2 (72-192 workgroups a
/// pass), a 512-token prefill's with 4 (thousands), see `pass_tn`.
const GPU_MIN_WORKGROUPS: u32 = 256;

/// `Kernels::min_workgroups` on CPU adapters: three a core (two left the
/// o and down gemms' three workgroups at 16 rows on two cores).
fn cpu_min_workgroups() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    3 * u32::try_from(cores).unwrap_or(u32::MAX / 3)
}
