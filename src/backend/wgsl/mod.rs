//! `Kernels`: every WGSL pipeline of the wgpu backend, and the choice of
//! variant (tile shapes, attention shape) per adapter. The ops themselves are
//! `Backend` methods (ops.rs); the fixed kernels come from the device's
//! `PipelineStore` at creation, gemm, embed and attention variants the first
//! time a step needs them.

pub mod attention;
mod dump;
pub mod embed;
pub mod gemm;
mod kv_tex;
mod ops;
pub mod roofs;
pub mod templates;
mod weight;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

pub use dump::RenderedKernel;
pub use gemm::{GemmParams, GemmVariant};
pub use templates::SHADER_FILES;
pub use weight::{GpuWeight, WeightWindow};

pub use crate::backend::{RopeArgs, RopePairing};

/// Activation rows in a wgpu buffer.
pub type Rows<'a> = crate::backend::Rows<'a, wgpu::Buffer>;
/// The paged KV cache in wgpu buffers.
pub type PagedKv<'a> = crate::backend::PagedKv<'a, wgpu::Buffer>;
/// What a gemm does with its output tile (see gemm.wgsl).
// (One per gemm call, passed by reference: the Rope variant's size costs nothing.)
#[allow(clippy::large_enum_variant)]
enum Epilogue<'a> {
    Plain,
    SiluMul,
    Rope {
        rope: RopeArgs<'a, wgpu::Buffer>,
        kv: PagedKv<'a>,
        q_w: u32,
        slot_mapping: &'a wgpu::Buffer,
        /// The K and V textures where the cache is held as textures (`kv_tex`).
        kv_tex: Option<[Bound; 2]>,
    },
}

use crate::gpu::{
    BindCache, Binding, Bound, BufSlice, GpuContext, GpuError, Kernel, PipelineStats, PipelineStore, StepEncoder,
};
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
    pub(crate) rms_norm: Arc<Kernel>,
    pub(crate) rope: Arc<Kernel>,
    pub(crate) rope_cache_write: Arc<Kernel>,
    pub(crate) silu_mul: Arc<Kernel>,
    pub(crate) argmax: Arc<Kernel>,
    pub(crate) masked_argmax: Arc<Kernel>,
    pub(crate) cache_write: Arc<Kernel>,
    pub(crate) cache_write_tex: Arc<Kernel>,
    attention: Mutex<HashMap<attention::AttentionVariant, Arc<Kernel>>>,
    gemm: Mutex<HashMap<GemmVariant, Arc<Kernel>>>,
    /// Textures gemm copies x rows into on CPU adapters, one per (buffer, row stride).
    /// (Their views are kept too: a step's bind groups are reused only for the same view.)
    x_tex: Mutex<HashMap<(wgpu::Buffer, u32), (wgpu::Texture, wgpu::TextureView)>>,
    embed: Mutex<HashMap<WeightFormat, Arc<Kernel>>>,
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
            cpu_shapes: ctx.is_cpu(),
            rms_norm: k("rms_norm", templates::file("rms_norm.wgsl"), &[R, R, RW, R, RW])?,
            rope: k("rope", templates::file("rope.wgsl"), &[R, R, RW])?,
            rope_cache_write: k(
                "rope_cache_write",
                templates::file("rope_cache_write.wgsl"),
                &[R, R, R, RW, RW, RW],
            )?,
            silu_mul: k("silu_mul", templates::file("silu_mul.wgsl"), &[R, RW])?,
            argmax: k("argmax", templates::file("argmax.wgsl"), &[R, RW])?,
            masked_argmax: k("masked_argmax", templates::file("masked_argmax.wgsl"), &[R, R, R, RW])?,
            cache_write: k("cache_write", templates::file("cache_write.wgsl"), &[R, R, RW, RW])?,
            cache_write_tex: k(
                "cache_write_tex",
                templates::file("cache_write_tex.wgsl"),
                &[R, R, Binding::StoreF32Array, Binding::StoreF32Array],
            )?,
            attention: Mutex::default(),
            gemm: Mutex::default(),
            x_tex: Mutex::default(),
            embed: Mutex::default(),
            kv_tex: Mutex::default(),
            dummy: dummy(),
            dummy_rw: dummy(),
            bind_cache: BindCache::shared(),
            store: store.clone(),
        };
        Ok(me)
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

    /// The row tiles (TM) the gemm of `w` uses: 1 for decodes, 4 / 8 / 16 for
    /// small batches (each weight load serves every row of the tile), and the
    /// prefill tile. Every tile gives the same bits (see gemm.wgsl).
    pub fn row_tiles(&self, w: &GpuWeight) -> Vec<u32> {
        self.row_tiles_of(w.format)
    }

    /// The row tiles of a weight format (see `row_tiles`).
    pub fn row_tiles_of(&self, format: WeightFormat) -> Vec<u32> {
        let max = if format.is_quantized() {
            self.tiles.quant_prefill_tm
        } else {
            self.tiles.prefill_tm
        };
        let mut v: Vec<u32> = [1, 4, 8, 16].into_iter().filter(|&m| m < max).collect();
        v.push(max);
        v
    }

    /// The row tile for `t` rows: the smallest that holds them, else the largest.
    pub fn row_tile(&self, w: &GpuWeight, t: u32) -> u32 {
        let tiles = self.row_tiles(w);
        tiles
            .iter()
            .copied()
            .find(|&m| m >= t)
            .unwrap_or(*tiles.last().expect("at least one tile"))
    }

    fn gemm_variant(&self, w: &GpuWeight, x: Rows, tm: u32, silu: bool, rope: bool) -> GemmVariant {
        let x_vec = w.k.is_multiple_of(8) && x.stride.is_multiple_of(4) && x.off.is_multiple_of(4);
        self.gemm_variant_of(w.format, tm, x_vec, silu, rope)
    }

    /// The variant for a format, row tile, x layout and epilogue on this
    /// adapter's tiles (the silu and rope epilogues, which take column
    /// pairs, round TN up to even).
    pub(crate) fn gemm_variant_of(
        &self,
        format: WeightFormat,
        tm: u32,
        x_vec: bool,
        silu: bool,
        rope: bool,
    ) -> GemmVariant {
        let tl = self.tiles;
        let tn = if tm == 1 { tl.decode_tn } else { tl.prefill_tn };
        GemmVariant {
            format,
            tm,
            tn: if silu || rope { tn.next_multiple_of(2) } else { tn },
            wg: tl.wg,
            x_vec,
            silu,
            w_tex: false,
            x_tex: false,
            rope,
            kv_tex: false,
        }
    }

    /// The texture x's rows are copied into for a gemm of `t` rows, where x
    /// can be (CPU adapters; rows of whole 256-byte multiples at a 16-byte
    /// aligned offset, within the adapter's texture size).
    fn x_texture(&self, x: Rows, t: u32) -> Option<(wgpu::Texture, wgpu::TextureView)> {
        let max = self.ctx.limits.max_texture_dimension_2d;
        let fits = (x.stride * 4).is_multiple_of(256) && x.off.is_multiple_of(4) && x.stride / 4 <= max;
        let rows = u32::try_from(x.buf.size() / 4 / u64::from(x.stride.max(1)))
            .ok()?
            .min(max);
        if !self.cpu_shapes || !fits || t == 0 || rows < t || u64::from(x.off + t * x.stride) * 4 > x.buf.size() {
            return None;
        }
        let mut cache = self.x_tex.lock().unwrap_or_else(|e| e.into_inner());
        let tex = cache.entry((x.buf.clone(), x.stride)).or_insert_with(|| {
            let tex = self.ctx.device.create_texture(&wgpu::TextureDescriptor {
                label: Some("gemm x"),
                size: wgpu::Extent3d {
                    width: x.stride / 4,
                    height: rows,
                    depth_or_array_layers: 1,
                },
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format: wgpu::TextureFormat::Rgba32Float,
                usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
                view_formats: &[],
            });
            let view = tex.create_view(&wgpu::TextureViewDescriptor::default());
            (tex, view)
        });
        Some(tex.clone())
    }

    fn gemm_kernel(&self, v: GemmVariant) -> Result<Arc<Kernel>, GpuError> {
        let mut cache = self.gemm.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&v) {
            return Ok(k.clone());
        }
        let xb = if v.x_tex { Binding::TexF32 } else { R };
        let storage: &[Binding] = match (v.format.is_quantized(), v.w_tex) {
            (true, false) => &[xb, R, R, RW],
            (false, false) => &[xb, R, RW],
            (true, true) => &[xb, Binding::TexU32, Binding::TexF32, RW],
            (false, true) => &[xb, Binding::TexU32, RW],
        };
        let store = Binding::StoreF32Array;
        let rope: &[Binding] = match (v.rope, v.kv_tex) {
            (false, _) => &[],
            (true, false) => &[R, R, R, RW, RW],
            (true, true) => &[R, R, R, store, store],
        };
        let storage: Vec<Binding> = storage.iter().chain(rope).copied().collect();
        let epilogue = match (v.silu, v.rope) {
            (true, _) => "_silu",
            (false, true) => "_rope",
            (false, false) => "",
        };
        let tex = match (v.w_tex, v.x_tex) {
            (true, true) => "_tex",
            (true, false) => "_wtex",
            (false, true) => "_xtex",
            (false, false) => "",
        };
        let kv = if v.kv_tex { "_kvtex" } else { "" };
        let name = format!("gemm_{:?}_{}x{}{epilogue}{tex}{kv}", v.format, v.tm, v.tn);
        let k = self
            .store
            .kernel(&self.ctx.device, &name, &gemm::source(v)?, &storage)?;
        cache.insert(v, k.clone());
        Ok(k)
    }

    pub(crate) fn embed_kernel(&self, f: WeightFormat) -> Result<Arc<Kernel>, GpuError> {
        let mut cache = self.embed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&f) {
            return Ok(k.clone());
        }
        let storage: &[Binding] = if f.is_quantized() { &[R, R, R, RW] } else { &[R, R, RW] };
        let k = self
            .store
            .kernel(&self.ctx.device, &format!("embed_{f:?}"), &embed::source(f)?, storage)?;
        cache.insert(f, k.clone());
        Ok(k)
    }

    /// `gemm` with the row tile `tm` chosen by the caller (tests compare them all).
    pub fn gemm_with(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        y: Rows,
        t: u32,
        tm: u32,
    ) -> Result<(), GpuError> {
        self.gemm_epilogue(enc, w, x, y, t, tm, &Epilogue::Plain)
    }

    /// Whether the rope epilogue's bindings fit the adapter (on CPU adapters
    /// x and the weights are textures, not storage buffers).
    pub fn fuses_qkv_rope(&self) -> bool {
        let storage = if self.cpu_shapes { 6 } else { 9 };
        self.ctx.limits.max_storage_buffers_per_shader_stage >= storage
    }

    /// `gemm_rope_kv` with the row tile `tm` chosen by the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_rope_kv_with(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        qkv: Rows,
        rope: RopeArgs<wgpu::Buffer>,
        kv: PagedKv,
        q_heads: u32,
        slot_mapping: &wgpu::Buffer,
        t: u32,
        tm: u32,
    ) -> Result<(), GpuError> {
        let (q_w, kv_w) = (q_heads * kv.head_dim, kv.kv_heads * kv.head_dim);
        if w.n as u32 != q_w + 2 * kv_w || !kv.head_dim.is_multiple_of(2) {
            return Err(GpuError::Limit(format!(
                "gemm_rope_kv: {} weight rows for {q_heads} q heads and {} KV heads of {}",
                w.n, kv.kv_heads, kv.head_dim
            )));
        }
        let kv_tex = self.kv_textures(kv.k_cache, kv.v_cache, kv.kv_rows)?;
        if kv_tex.is_some() {
            // Caches as textures: the epilogue writes whole texels, groups of
            // 8 W rows; where the tile or windows do not allow it, the gemm
            // and rope_cache_write run one after the other.
            let v = self.gemm_variant(w, x, tm, false, true);
            let starts: Vec<u32> = if self.cpu_shapes && !w.tex.is_empty() {
                w.tex.iter().map(|t| t.row0).collect()
            } else {
                let windows = w.windows(self.binding_limit, self.storage_align())?;
                windows.iter().map(|b| b.row0).collect()
            };
            let aligned = v.tn.is_multiple_of(8) && kv.head_dim.is_multiple_of(8);
            if !aligned || starts.iter().any(|r| !r.is_multiple_of(8)) {
                self.gemm_with(enc, w, x, qkv, t, tm)?;
                return crate::backend::Backend::rope_cache_write(
                    self,
                    enc,
                    qkv.buf,
                    qkv.stride,
                    rope,
                    kv,
                    q_heads,
                    slot_mapping,
                    t,
                );
            }
        }
        let ep = Epilogue::Rope {
            rope,
            kv,
            q_w,
            slot_mapping,
            kv_tex,
        };
        self.gemm_epilogue(enc, w, x, qkv, t, tm, &ep)
    }

    /// `gemm_silu_mul` with the row tile `tm` chosen by the caller.
    pub fn gemm_silu_mul_with(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        y: Rows,
        t: u32,
        tm: u32,
    ) -> Result<(), GpuError> {
        if !w.n.is_multiple_of(2) {
            return Err(GpuError::Limit(format!(
                "gemm_silu_mul needs interleaved gate/up rows (an even count), got {}",
                w.n
            )));
        }
        self.gemm_epilogue(enc, w, x, y, t, tm, &Epilogue::SiluMul)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_epilogue(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        y: Rows,
        t: u32,
        tm: u32,
        ep: &Epilogue,
    ) -> Result<(), GpuError> {
        let silu = matches!(ep, Epilogue::SiluMul);
        let rope = matches!(ep, Epilogue::Rope { .. });
        let mut v = self.gemm_variant(w, x, tm, silu, rope);
        // Textures on CPU adapters; the GPU shapes read buffers (and are
        // tested that way on lavapipe too).
        v.w_tex = self.cpu_shapes && !w.tex.is_empty();
        let x_tex = if v.x_vec { self.x_texture(x, t) } else { None };
        v.x_tex = x_tex.is_some();
        let x_bound = match &x_tex {
            Some((tex, view)) => {
                let src = BufSlice::range(x.buf, u64::from(x.off) * 4, u64::from(t * x.stride) * 4);
                enc.copy_to_texture(src, tex, x.stride / 4, t);
                Bound::Tex {
                    view: view.clone(),
                    bytes: u64::from(t * x.stride) * 4,
                }
            }
            None => Bound::Buf(BufSlice::whole(x.buf)),
        };
        v.kv_tex = matches!(ep, Epilogue::Rope { kv_tex: Some(_), .. });
        let kernel = self.gemm_kernel(v)?;
        let windows: Vec<(u32, u32, Vec<Bound>)> = if v.w_tex {
            let tex = w.tex.iter();
            tex.map(|t| {
                (
                    t.row0,
                    t.rows,
                    [Some(t.data.clone()), t.scales.clone()].into_iter().flatten().collect(),
                )
            })
            .collect()
        } else {
            let bufs = w.windows(self.binding_limit, self.storage_align())?.into_iter();
            bufs.map(|b| {
                (
                    b.row0,
                    b.rows,
                    [Some(b.data), b.scales].into_iter().flatten().map(Bound::Buf).collect(),
                )
            })
            .collect()
        };
        for (row0, rows, wb) in windows {
            let mut p = GemmParams {
                t,
                n: rows,
                k: w.k as u32,
                chunks: w.chunks() as u32,
                x_stride: x.stride,
                y_stride: y.stride,
                x_off: x.off,
                y_off: y.off + if silu { row0 / 2 } else { row0 },
                w_row: w.w_row() as u32,
                ..GemmParams::default()
            };
            let mut bufs = vec![x_bound.clone()];
            bufs.extend(wb);
            bufs.push(Bound::Buf(BufSlice::whole(y.buf)));
            if let Epilogue::Rope {
                rope,
                kv,
                q_w,
                slot_mapping,
                kv_tex,
            } = ep
            {
                let kv_w = kv.kv_heads * kv.head_dim;
                (p.y_off, p.col0, p.q_w, p.kv_w) = (y.off, row0, *q_w, kv_w);
                (p.hd, p.pairing, p.max_pos) = (kv.head_dim, rope.pairing as u32, rope.max_pos);
                let [k_cache, v_cache] = match kv_tex {
                    Some(tex) => tex.clone(),
                    None => ops::kv_caches(kv).map(Bound::Buf),
                };
                bufs.extend(
                    [
                        BufSlice::whole(rope.positions),
                        BufSlice::whole(rope.table),
                        BufSlice::whole(slot_mapping),
                    ]
                    .map(Bound::Buf),
                );
                bufs.extend([k_cache, v_cache]);
            }
            let cols = rows.div_ceil(v.tn * v.wg);
            enc.dispatch_bound(&kernel, bytemuck::bytes_of(&p), bufs, [cols, t.div_ceil(v.tm), 1]);
        }
        Ok(())
    }

    /// The `paged_attention` variant for a head shape: on CPU adapters a workgroup
    /// serves every query head of a KV head (each K/V row loaded once).
    pub(crate) fn attention_variant(&self, head_dim: u32, group: u32, t: u32) -> attention::AttentionVariant {
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
        // `wllm profile`); decode-sized steps keep one token a workgroup.
        // The tile's q and accumulators are registers (qt·g·head_dim floats
        // each, unrolled): bounded so the kernel stays quick to compile.
        let qt = if self.cpu_shapes && t >= 64 {
            (768 / (g * head_dim).max(1)).clamp(1, 4)
        } else {
            1
        };
        // Lanes that are one subgroup merge without workgroup memory (whose
        // lane-varying loads and stores llvmpipe runs lane by lane).
        let subgroups = self.cpu_shapes
            && self.ctx.features.contains(wgpu::Features::SUBGROUP)
            && self.ctx.info.subgroup_min_size >= w;
        attention::AttentionVariant {
            head_dim,
            w,
            g,
            qt,
            kv_tex: false,
            subgroups,
        }
    }

    pub(crate) fn attention_kernel(&self, v: attention::AttentionVariant) -> Result<Arc<Kernel>, GpuError> {
        let mut cache = self.attention.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&v) {
            return Ok(k.clone());
        }
        let kv = if v.kv_tex { "_kvtex" } else { "" };
        let sg = if v.subgroups { "_sg" } else { "" };
        let name = format!("paged_attention_{}x{}x{}x{}{kv}{sg}", v.head_dim, v.w, v.g, v.qt);
        let tex = Binding::TexF32Array;
        let storage = if v.kv_tex {
            [R, tex, tex, R, R, R, RW]
        } else {
            [R, R, R, R, R, R, RW]
        };
        let k = self
            .store
            .kernel(&self.ctx.device, &name, &attention::source(v)?, &storage)?;
        cache.insert(v, k.clone());
        Ok(k)
    }
}
