//! The ops the model calls, each encoding one WGSL kernel into a `StepEncoder`.
//! `Kernels` owns every pipeline; gemm and embed variants are compiled per weight
//! format on first `prepare` (at model load) and warmed there.

pub mod attention;
pub mod embed;
pub mod gemm;
mod weight;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

pub use gemm::{GemmParams, GemmVariant};
pub use weight::{GpuWeight, WeightWindow};

pub use crate::backend::{PagedKv, RopePairing, Rows};
use crate::gpu::{BindCache, Binding, BufSlice, GpuContext, GpuError, Kernel, StepEncoder};
use crate::quant::WeightFormat;

/// Register-tile shapes of the gemm, chosen per adapter class.
#[derive(Clone, Copy, Debug)]
pub struct GemmTiles {
    pub decode_tn: u32,
    pub prefill_tm: u32,
    pub prefill_tn: u32,
    pub quant_prefill_tm: u32,
    pub wg: u32,
}

impl GemmTiles {
    /// lavapipe: one workgroup runs on one thread as 8 SIMD lanes; big register
    /// tiles amortise loads (see DESIGN.md, "what a probe found").
    pub fn cpu() -> Self {
        Self {
            decode_tn: 16,
            prefill_tm: 32,
            prefill_tn: 16,
            quant_prefill_tm: 16,
            wg: 8,
        }
    }

    /// GPUs: 64-lane workgroups and small tiles that keep occupancy up.
    pub fn gpu() -> Self {
        Self {
            decode_tn: 4,
            prefill_tm: 8,
            prefill_tn: 8,
            quant_prefill_tm: 8,
            wg: 64,
        }
    }

    pub fn for_adapter(ctx: &GpuContext) -> Self {
        // WLLM_GEMM_TILES=decode_tn,prefill_tm,prefill_tn,quant_prefill_tm,wg overrides (for tuning).
        if let Some(v) = std::env::var("WLLM_GEMM_TILES").ok().and_then(|s| {
            let v: Vec<u32> = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            (v.len() == 5 && !v.contains(&0)).then_some(v)
        }) {
            return Self {
                decode_tn: v[0],
                prefill_tm: v[1],
                prefill_tn: v[2],
                quant_prefill_tm: v[3],
                wg: v[4],
            };
        }
        if ctx.is_cpu() { Self::cpu() } else { Self::gpu() }
    }
}

/// Row-wise settings of `rms_norm`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct NormParams {
    t: u32,
    d: u32,
    eps: f32,
    residual: u32,
    gather: u32,
    pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    t: u32,
    heads: u32,
    kv_heads: u32,
    q_stride: u32,
    block_size: u32,
    max_blocks: u32,
    scale: f32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeParams {
    t: u32,
    heads: u32,
    head_dim: u32,
    stride: u32,
    pairing: u32,
    max_pos: u32,
    pad: [u32; 2],
}

/// Every pipeline of the engine.
pub struct Kernels {
    pub ctx: GpuContext,
    pub tiles: GemmTiles,
    /// Kernel shapes for CPU adapters (lavapipe) rather than GPUs.
    pub cpu_shapes: bool,
    rms_norm: Arc<Kernel>,
    rope: Arc<Kernel>,
    silu_mul: Arc<Kernel>,
    argmax: Arc<Kernel>,
    cache_write: Arc<Kernel>,
    attention: Mutex<HashMap<attention::AttentionVariant, Arc<Kernel>>>,
    gemm: Mutex<HashMap<GemmVariant, Arc<Kernel>>>,
    embed: Mutex<HashMap<WeightFormat, Arc<Kernel>>>,
    /// Largest byte range one storage binding may cover (weights beyond it are
    /// bound window by window).
    pub binding_limit: u64,
    // dummy, dummy_rw: 16-byte buffers bound where a kernel ignores a binding
    dummy: wgpu::Buffer,
    dummy_rw: wgpu::Buffer,
    /// Bind groups of the steps recorded through the `Backend` interface (the
    /// engine's), reused across steps.
    pub bind_cache: Arc<Mutex<BindCache>>,
}

use Binding::{Read as R, ReadWrite as RW};

fn u32s(v: &[u32; 4]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl Kernels {
    /// Compiles the fixed kernels and warms each with one dispatch.
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let k = |name: &str, src: &str, b: &[Binding]| Kernel::new(ctx, name, src, b).map(Arc::new);
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
            tiles: GemmTiles::for_adapter(ctx),
            cpu_shapes: ctx.is_cpu(),
            rms_norm: k(
                "rms_norm",
                include_str!("../../shaders/rms_norm.wgsl"),
                &[R, R, RW, R, RW],
            )?,
            rope: k("rope", include_str!("../../shaders/rope.wgsl"), &[R, R, RW])?,
            silu_mul: k("silu_mul", include_str!("../../shaders/silu_mul.wgsl"), &[R, RW])?,
            argmax: k("argmax", include_str!("../../shaders/argmax.wgsl"), &[R, RW])?,
            cache_write: k(
                "cache_write",
                include_str!("../../shaders/cache_write.wgsl"),
                &[R, R, RW, RW],
            )?,
            attention: Mutex::default(),
            gemm: Mutex::default(),
            embed: Mutex::default(),
            dummy: dummy(),
            dummy_rw: dummy(),
            bind_cache: BindCache::shared(),
        };
        me.warm()?;
        Ok(me)
    }

    fn warm(&self) -> Result<(), GpuError> {
        let (a, b) = (self.scratch(4096), self.scratch(4096));
        let mut enc = StepEncoder::new(&self.ctx);
        self.rms_norm(&mut enc, Rows::new(&a, 8), &a, None, None, 1e-5, 1, 8, &b);
        self.rope(&mut enc, &b, 8, &a, &a, 1, 1, 1, 8, RopePairing::RotateHalf);
        self.silu_mul(&mut enc, &a, &b, 1, 4);
        self.argmax(&mut enc, &a, 8, 1, &b);
        enc.submit_and_read(&[])?;
        Ok(())
    }

    fn storage_align(&self) -> u64 {
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
        let max = if w.format.is_quantized() {
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

    fn gemm_variant(&self, w: &GpuWeight, x: Rows, tm: u32) -> GemmVariant {
        let tl = self.tiles;
        GemmVariant {
            format: w.format,
            tm,
            tn: if tm == 1 { tl.decode_tn } else { tl.prefill_tn },
            wg: tl.wg,
            x_vec: w.k.is_multiple_of(8) && x.stride.is_multiple_of(4) && x.off.is_multiple_of(4),
        }
    }

    fn gemm_kernel(&self, v: GemmVariant) -> Result<Arc<Kernel>, GpuError> {
        let mut cache = self.gemm.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&v) {
            return Ok(k.clone());
        }
        let storage: &[Binding] = if v.format.is_quantized() {
            &[R, R, R, RW]
        } else {
            &[R, R, RW]
        };
        let name = format!("gemm_{:?}_{}x{}", v.format, v.tm, v.tn);
        let k = Arc::new(Kernel::new(&self.ctx, &name, &gemm::source(v), storage)?);
        cache.insert(v, k.clone());
        Ok(k)
    }

    fn embed_kernel(&self, f: WeightFormat) -> Result<Arc<Kernel>, GpuError> {
        let mut cache = self.embed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&f) {
            return Ok(k.clone());
        }
        let storage: &[Binding] = if f.is_quantized() { &[R, R, R, RW] } else { &[R, R, RW] };
        let k = Arc::new(Kernel::new(
            &self.ctx,
            &format!("embed_{f:?}"),
            &embed::source(f),
            storage,
        )?);
        cache.insert(f, k.clone());
        Ok(k)
    }

    /// Compiles and warms every gemm variant (row tile) `w` will use.
    pub fn prepare_gemm(&self, w: &GpuWeight) -> Result<(), GpuError> {
        let x = self.scratch((w.k.div_ceil(8) * 8 * 4) as u64);
        let y = self.scratch(4 * 64);
        let mut enc = StepEncoder::new(&self.ctx);
        for tm in self.row_tiles(w) {
            let xr = Rows::new(&x, w.k.div_ceil(8) * 8);
            self.gemm_with(&mut enc, w, xr, Rows::new(&y, 1), 1, tm)?;
        }
        enc.submit_and_read(&[])?;
        Ok(())
    }

    /// Compiles and warms the embed kernel for `w`'s format.
    pub fn prepare_embed(&self, w: &GpuWeight) -> Result<(), GpuError> {
        let ids = self.scratch(16);
        let out = self.scratch((w.k * 4) as u64);
        let mut enc = StepEncoder::new(&self.ctx);
        self.embed(&mut enc, w, &ids, 1, &out)?;
        enc.submit_and_read(&[])?;
        Ok(())
    }

    /// Y[t, :N] = X[t, :K] · Wᵀ for `t` rows; the row tile follows `t`.
    pub fn gemm(&self, enc: &mut StepEncoder, w: &GpuWeight, x: Rows, y: Rows, t: u32) -> Result<(), GpuError> {
        self.gemm_with(enc, w, x, y, t, self.row_tile(w, t))
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
        let v = self.gemm_variant(w, x, tm);
        let kernel = self.gemm_kernel(v)?;
        for win in w.windows(self.binding_limit, self.storage_align())? {
            let p = GemmParams {
                t,
                n: win.rows,
                k: w.k as u32,
                chunks: w.chunks() as u32,
                x_stride: x.stride,
                y_stride: y.stride,
                x_off: x.off,
                y_off: y.off + win.row0,
                w_row: w.w_row() as u32,
                pad: [0; 3],
            };
            let mut bufs = vec![BufSlice::whole(x.buf), win.data];
            bufs.extend(win.scales);
            bufs.push(BufSlice::whole(y.buf));
            let cols = win.rows.div_ceil(v.tn * v.wg);
            enc.dispatch(&kernel, bytemuck::bytes_of(&p), &bufs, [cols, t.div_ceil(v.tm), 1]);
        }
        Ok(())
    }

    /// out[t, :] = W[ids[t], :] for `t` tokens.
    pub fn embed(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        ids: &wgpu::Buffer,
        t: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let kernel = self.embed_kernel(w.format)?;
        for win in w.windows(self.binding_limit, self.storage_align())? {
            let p = embed::EmbedParams {
                t,
                d: w.k as u32,
                chunks: w.chunks() as u32,
                w_row: w.w_row() as u32,
                vocab: w.n as u32,
                row0: win.row0,
                rows: win.rows,
                pad: 0,
            };
            let mut bufs = vec![BufSlice::whole(ids), win.data];
            bufs.extend(win.scales);
            bufs.push(BufSlice::whole(out));
            enc.dispatch(
                &kernel,
                bytemuck::bytes_of(&p),
                &bufs,
                [(w.chunks() as u32).div_ceil(64), t, 1],
            );
        }
        Ok(())
    }

    /// y[i] = rms_norm(h_i)·w over rows of length `d`; with `residual`, h = r + x is
    /// written back to r; with `rows`, output row i reads input row rows[i].
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        enc: &mut StepEncoder,
        x: Rows,
        w: &wgpu::Buffer,
        residual: Option<&wgpu::Buffer>,
        rows: Option<&wgpu::Buffer>,
        eps: f32,
        t: u32,
        d: u32,
        y: &wgpu::Buffer,
    ) {
        let p = NormParams {
            t,
            d,
            eps,
            residual: residual.is_some() as u32,
            gather: rows.is_some() as u32,
            pad: [0; 3],
        };
        let bufs = [
            BufSlice::whole(x.buf),
            BufSlice::whole(w),
            BufSlice::whole(residual.unwrap_or(&self.dummy_rw)),
            BufSlice::whole(rows.unwrap_or(&self.dummy)),
            BufSlice::whole(y),
        ];
        enc.dispatch(&self.rms_norm, bytemuck::bytes_of(&p), &bufs, [t, 1, 1]);
    }

    /// Rotates the first `heads` heads of each of `t` rows of `x` in place.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        enc: &mut StepEncoder,
        x: &wgpu::Buffer,
        stride: u32,
        positions: &wgpu::Buffer,
        table: &wgpu::Buffer,
        max_pos: u32,
        t: u32,
        heads: u32,
        head_dim: u32,
        pairing: RopePairing,
    ) {
        let p = RopeParams {
            t,
            heads,
            head_dim,
            stride,
            pairing: pairing as u32,
            max_pos,
            pad: [0; 2],
        };
        let bufs = [BufSlice::whole(positions), BufSlice::whole(table), BufSlice::whole(x)];
        enc.dispatch(
            &self.rope,
            bytemuck::bytes_of(&p),
            &bufs,
            [(heads * head_dim / 2).div_ceil(64), t, 1],
        );
    }

    /// out[t, i] = silu(gu[t, i]) · gu[t, inter + i].
    pub fn silu_mul(&self, enc: &mut StepEncoder, gu: &wgpu::Buffer, out: &wgpu::Buffer, t: u32, inter: u32) {
        let bufs = [BufSlice::whole(gu), BufSlice::whole(out)];
        enc.dispatch(
            &self.silu_mul,
            u32s(&[t, inter, 0, 0]),
            &bufs,
            [inter.div_ceil(64), t, 1],
        );
    }

    /// The `paged_attention` variant for a head shape: on CPU adapters a workgroup
    /// serves every query head of a KV head (each K/V row loaded once).
    fn attention_variant(&self, head_dim: u32, group: u32) -> attention::AttentionVariant {
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
        attention::AttentionVariant { head_dim, w, g }
    }

    fn attention_kernel(&self, v: attention::AttentionVariant) -> Result<Arc<Kernel>, GpuError> {
        let mut cache = self.attention.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&v) {
            return Ok(k.clone());
        }
        let name = format!("paged_attention_{}x{}x{}", v.head_dim, v.w, v.g);
        let k = Arc::new(Kernel::new(
            &self.ctx,
            &name,
            &attention::source(v),
            &[R, R, R, R, R, R, RW],
        )?);
        cache.insert(v, k.clone());
        Ok(k)
    }

    /// Compiles and warms `paged_attention` for `head_dim` and `heads` query heads over `kv_heads`.
    pub fn prepare_attention(&self, head_dim: u32, heads: u32, kv_heads: u32) -> Result<(), GpuError> {
        let b = self.scratch(u64::from(head_dim) * 16);
        let kv = PagedKv {
            k_cache: &b,
            v_cache: &b,
            kv_heads,
            head_dim,
            block_size: 1,
            positions: &self.dummy,
            token_seq: &self.dummy,
            block_tables: &self.dummy,
            max_blocks: 1,
        };
        let out = self.scratch(u64::from(head_dim * heads) * 4);
        let q = self.scratch(u64::from(head_dim * heads) * 4);
        let mut enc = StepEncoder::new(&self.ctx);
        self.paged_attention(&mut enc, &q, u32::MAX, kv, heads, 1, &out)?;
        enc.submit_and_read(&[])?;
        Ok(())
    }

    /// K, V of `t` tokens (at `k_off`, `v_off` in rows of `qkv`) into the cache slots `slot_mapping`.
    #[allow(clippy::too_many_arguments)]
    pub fn cache_write(
        &self,
        enc: &mut StepEncoder,
        qkv: Rows,
        k_off: u32,
        v_off: u32,
        kv_width: u32,
        slot_mapping: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        t: u32,
    ) {
        let p = [t, kv_width, qkv.stride, k_off, v_off, 0, 0, 0];
        let bufs = [
            BufSlice::whole(qkv.buf),
            BufSlice::whole(slot_mapping),
            BufSlice::whole(k_cache),
            BufSlice::whole(v_cache),
        ];
        enc.dispatch(
            &self.cache_write,
            bytemuck::cast_slice(&p),
            &bufs,
            [kv_width.div_ceil(64), t, 1],
        );
    }

    /// Causal attention of `t` query rows (`heads` heads at the start of each
    /// `q_stride`-long row of `q`) over the paged cache; `q_stride == u32::MAX` means heads·head_dim.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        enc: &mut StepEncoder,
        q: &wgpu::Buffer,
        q_stride: u32,
        kv: PagedKv,
        heads: u32,
        t: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let v = self.attention_variant(kv.head_dim, heads / kv.kv_heads.max(1));
        let kernel = self.attention_kernel(v)?;
        let p = AttentionParams {
            t,
            heads,
            kv_heads: kv.kv_heads,
            q_stride: if q_stride == u32::MAX {
                heads * kv.head_dim
            } else {
                q_stride
            },
            block_size: kv.block_size,
            max_blocks: kv.max_blocks,
            scale: 1.0 / (kv.head_dim as f32).sqrt(),
            pad: 0,
        };
        let bufs = [
            BufSlice::whole(q),
            BufSlice::whole(kv.k_cache),
            BufSlice::whole(kv.v_cache),
            BufSlice::whole(kv.positions),
            BufSlice::whole(kv.token_seq),
            BufSlice::whole(kv.block_tables),
            BufSlice::whole(out),
        ];
        enc.dispatch(&kernel, bytemuck::bytes_of(&p), &bufs, [heads / v.g, t, 1]);
        Ok(())
    }

    /// out[r] = argmax of row r of `x` (`rows` rows of `n`).
    pub fn argmax(&self, enc: &mut StepEncoder, x: &wgpu::Buffer, n: u32, rows: u32, out: &wgpu::Buffer) {
        let bufs = [BufSlice::whole(x), BufSlice::whole(out)];
        enc.dispatch(&self.argmax, u32s(&[rows, n, 0, 0]), &bufs, [rows, 1, 1]);
    }
}

/// The (cos, sin) table of rotary embedding, (max_pos, head_dim/2) pairs, in f64 then f32.
pub fn rope_table(max_pos: usize, head_dim: usize, theta: f64) -> Vec<f32> {
    rope_table_scaled(max_pos, head_dim, theta, None)
}

/// `rope_table` with a divisor per frequency (Llama 3 scaling).
pub fn rope_table_scaled(max_pos: usize, head_dim: usize, theta: f64, factors: Option<&[f64]>) -> Vec<f32> {
    let half = head_dim / 2;
    let mut t = Vec::with_capacity(max_pos * half * 2);
    for pos in 0..max_pos {
        for i in 0..half {
            let freq = theta.powf(-2.0 * i as f64 / head_dim as f64) / factors.map_or(1.0, |f| f[i]);
            let a = pos as f64 * freq;
            t.push(a.cos() as f32);
            t.push(a.sin() as f32);
        }
    }
    t
}
