//! The gemm ops of the wgpu backend: which variant (row tile, x layout,
//! epilogue, textures) a gemm runs, its pipeline, and its dispatches window by
//! window. The kernel is `shaders/gemm.wgsl`; `Backend::gemm`,
//! `gemm_residual`, `gemm_silu_mul` and `gemm_rope_kv` (ops.rs) call these with
//! the row tile for their batch, the tests with every tile.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::gemm::{self, GemmParams, GemmVariant};
use super::weight::{Residency, TexLayout, scale_binding};
use super::{Binding, Bound, BufSlice, GpuError, GpuWeight, Kernel, Kernels, PagedKv, R, RW, RopeArgs, Rows, kv_tex};
use crate::backend::KvDtype;
use crate::backend::NormArgs;
use crate::gpu::StepEncoder;
use crate::quant::WeightFormat;

/// What a gemm does with its output tile (see gemm.wgsl).
// (One per gemm call, passed by reference: the Rope variant's size costs nothing.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Epilogue<'a> {
    Plain,
    /// y += the tile (the residual add).
    Residual,
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

impl Kernels {
    /// The row tiles (TM) the gemm of `w` uses: 1 for decodes, 4 / 8 / 16 for
    /// small batches (each weight load serves every row of the tile), and the
    /// prefill tile. Every tile gives the same bits (see gemm.wgsl).
    pub fn row_tiles(&self, w: &GpuWeight) -> Vec<u32> {
        self.row_tiles_of(w.format)
    }

    /// The row tiles of a weight format (see `row_tiles`), up to the row-tile
    /// cap the warm-up chose (`set_row_tile_cap`).
    pub fn row_tiles_of(&self, format: WeightFormat) -> Vec<u32> {
        row_tiles_upto(self.prefill_tile(format).min(self.row_tile_cap()))
    }

    /// The largest row tile of a weight format before any cap.
    fn prefill_tile(&self, format: WeightFormat) -> u32 {
        if format.is_quantized() {
            self.tiles.quant_prefill_tm
        } else {
            self.tiles.prefill_tm
        }
    }

    /// The row-tile caps for batched gemms over `format` weights, largest
    /// first: the tiles of 8 rows or more, where the
    /// adapter's tiles were not given (`--gemm-tiles`). Which is fastest
    /// depends on the CPU and the kernel more than the tile sizes suggest:
    /// llvmpipe spills most of a 16x24 tile's accumulators (on an AMD EPYC,
    /// Zen 4, while the quantised gemm kept a tile's partial sums live too, a
    /// 128-token prefill of the default model took 1494 ms in 16-row tiles and
    /// 688-940 ms in 8-row tiles, `wllm profile`; since it reduces a column at
    /// a time, 16 rows win there again: 625-635 ms). Every tile gives the same
    /// bits, so only speed differs.
    pub fn row_tile_caps(&self, format: WeightFormat) -> Vec<u32> {
        if self.tiles_given {
            return Vec::new();
        }
        let mut v: Vec<u32> = row_tiles_upto(self.prefill_tile(format))
            .into_iter()
            .filter(|&m| m >= 8)
            .collect();
        v.reverse();
        v
    }

    /// Caps the row tile of batched gemms at `cap` rows (`u32::MAX`: no cap).
    pub fn set_row_tile_cap(&self, cap: u32) {
        self.row_cap.store(cap.max(1), Ordering::Relaxed);
    }

    /// The row-tile cap in force (`u32::MAX`: none).
    pub fn row_tile_cap(&self) -> u32 {
        self.row_cap.load(Ordering::Relaxed)
    }

    /// The row tile for `t` rows: the smallest that holds them, else the
    /// largest; then, while the dispatch would have fewer than
    /// `min_workgroups` workgroups, the next smaller one, down to 8 rows
    /// (lavapipe, default model, `wllm profile --batch 8,16`: at 16 rows the
    /// o and down gemms 42 -> 47 % of the FMA roof in 8-row tiles, the qkv
    /// gemm 33 -> 36 %; at 8 rows 4-row tiles gained nothing).
    pub fn row_tile(&self, w: &GpuWeight, t: u32) -> u32 {
        let cols = (w.n as u32).div_ceil(self.tiles.prefill_tn * self.tiles.wg);
        pick_row_tile(&self.row_tiles(w), t, cols, self.min_workgroups)
    }

    /// The passes a gemm of `t` rows runs, as (first row, row tile): the
    /// `row_tile`, and where its last tile would run mostly empty, a second
    /// pass of a smaller tile for the rows left (34 rows: 32 in 16-row tiles,
    /// then 2 in a 4-row tile, instead of a third 16-row tile for 2 rows).
    pub fn row_passes(&self, w: &GpuWeight, t: u32) -> Vec<(u32, u32)> {
        split_rows(&self.row_tiles(w), t, self.row_tile(w, t))
    }

    fn gemm_variant(&self, w: &GpuWeight, x: Rows, tm: u32, silu: bool, rope: bool) -> GemmVariant {
        let x_vec = w.k.is_multiple_of(8) && x.stride.is_multiple_of(4) && x.off.is_multiple_of(4);
        self.gemm_variant_of(w.format, tm, x_vec, silu, rope)
    }

    /// The column tile of a gemm pass of `rows` rows in tiles of `tm`: the
    /// variant's, and on GPUs, for batched tiles, halved while the dispatch
    /// would have fewer than `min_workgroups` workgroups (each lane's loop
    /// over K is a chain of dependent loads there, so a narrow weight at a
    /// small batch wants more lanes, not wider tiles). Every tile gives the
    /// same bits. An NVIDIA H200, `wllm profile --device wgpu`, column tile 4
    /// against 1 (2 for the column-pair epilogues) for every batched pass:
    /// 16-row decode step 6.52-6.64 -> 4.90 ms (the o and down gemms' 20
    /// workgroups a pass -> 72: 3.99 -> 2.70 ms), 512-token prefill 15.85 ->
    /// 17.63 ms (its passes have thousands of workgroups: they keep 4 here).
    fn pass_tn(&self, w: &GpuWeight, x: Rows, tm: u32, rows: u32, silu: bool, rope: bool) -> u32 {
        let tn = self.gemm_variant(w, x, tm, silu, rope).tn;
        if self.cpu_shapes || tm == 1 {
            // (CPU adapters' weight textures are laid out for their tile.)
            return tn;
        }
        let row_tiles = rows.div_ceil(tm);
        narrow_tn(
            tn,
            w.n as u32,
            row_tiles,
            self.tiles.wg,
            self.min_workgroups,
            silu || rope,
        )
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
            x_lanes: false,
            rope,
            kv_tex: false,
            kv_f16: false,
            norm: false,
            residual: false,
        }
    }

    fn gemm_kernel(&self, v: GemmVariant) -> Result<Arc<Kernel>, GpuError> {
        super::variant_kernel(&self.gemm, v, || self.compile_gemm(v))
    }

    fn compile_gemm(&self, v: GemmVariant) -> Result<Arc<Kernel>, GpuError> {
        let xb = if v.x_tex { Binding::LoadRgba32Float } else { R };
        let storage: Vec<Binding> = match (v.format.is_quantized(), v.w_tex) {
            (true, false) => vec![xb, R, R, RW],
            (false, false) => vec![xb, R, RW],
            (true, true) => vec![xb, Binding::LoadRgba32Uint, scale_binding(v.format), RW],
            (false, true) => vec![xb, Binding::LoadRgba32Uint, RW],
        };
        let store = kv_tex::store_binding(if v.kv_f16 { KvDtype::F16 } else { KvDtype::F32 });
        let rope: &[Binding] = match (v.rope, v.kv_tex) {
            (false, _) => &[],
            (true, false) => &[R, R, R, RW, RW],
            (true, true) => &[R, R, R, store, store],
        };
        let norm: &[Binding] = match (v.norm, v.x_tex) {
            (false, _) => &[],
            (true, true) => &[Binding::LoadRgba32Float],
            (true, false) => &[R],
        };
        let storage: Vec<Binding> = storage.iter().chain(rope).chain(norm).copied().collect();
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
        let half = if v.rope && v.kv_f16 { "_f16" } else { "" };
        let norm = if v.norm { "_norm" } else { "" };
        let res = if v.residual { "_res" } else { "" };
        let name = format!(
            "gemm_{:?}_{}x{}{epilogue}{tex}{kv}{half}{norm}{res}",
            v.format, v.tm, v.tn
        );
        self.store.kernel(&self.ctx.device, &name, &gemm::source(v)?, &storage)
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
        self.gemm_epilogue(enc, w, x, None, y, t, &[(0, tm)], &Epilogue::Plain)
    }

    /// `gemm_residual` (y += X·Wᵀ) with the row tile `tm` chosen by the caller.
    pub fn gemm_residual_with(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        y: Rows,
        t: u32,
        tm: u32,
    ) -> Result<(), GpuError> {
        self.gemm_epilogue(enc, w, x, None, y, t, &[(0, tm)], &Epilogue::Residual)
    }

    /// Whether gemms can take the rms_norm of x rows of `d` floats, so that
    /// a layer makes two dispatches fewer: a dispatch saved (tens of µs on
    /// lavapipe, a few on a GPU, where the norm's own launch and its round
    /// trip through memory were a fifth of a one-row decode step) is worth
    /// more than the x·g and Σx² each invocation adds to the loads it makes
    /// anyway. CPU adapters copy x into a texture (rows of whole 256-byte
    /// multiples); GPUs read x and the norm weight as `vec4` buffers (rows of
    /// a multiple of 8 floats), one storage binding more than the rope
    /// epilogue's nine.
    pub fn fuses_norm(&self, d: u32) -> bool {
        let limits = &self.ctx.limits;
        if self.cpu_shapes {
            d > 0 && (d * 4).is_multiple_of(256) && d / 4 <= limits.max_texture_dimension_2d
        } else {
            d > 0 && d.is_multiple_of(8) && limits.max_storage_buffers_per_shader_stage >= 10
        }
    }

    /// Where this kernel set keeps a weight. On CPU adapters with CPU shapes,
    /// textures in the layout of its tiles, and nothing else where every gemm
    /// pass reads them: decode and prefill tiles of one column count, even
    /// (the silu and rope epilogues round TN up to even), so that
    /// `reads_textures` holds for every pass; the embedding gather reads them
    /// too. Else textures and buffers (tiles set by `--gemm-tiles` whose
    /// passes differ); on GPUs and with GPU shapes, buffers.
    /// Whether weights in the narrow layouts (`quant::planes`) are kept as
    /// such, read from storage buffers: on GPUs and with GPU shapes; on CPU
    /// adapters whose weights are textures, the wide layouts' textures
    /// instead (see the README's figures). `WLLM_NARROW_WEIGHTS=1|0` overrides.
    pub fn reads_narrow_weights(&self) -> bool {
        match std::env::var("WLLM_NARROW_WEIGHTS").ok().as_deref() {
            Some("1") | Some("on") => true,
            Some("0") | Some("off") => false,
            _ => matches!(self.residency(), Residency::Buffers),
        }
    }

    pub fn residency(&self) -> Residency {
        if !(self.cpu_shapes && self.ctx.cpu_textures()) {
            return Residency::Buffers;
        }
        let layout = TexLayout::new(&self.ctx, self.tiles);
        let t = self.tiles;
        if t.decode_tn == t.prefill_tn && t.decode_tn.is_multiple_of(2) {
            Residency::Textures(layout)
        } else {
            Residency::Both(layout)
        }
    }

    /// Checks that a weight binds on this adapter: its buffer windows, or
    /// its textures (laid out within the adapter's limits at upload).
    pub(super) fn prepare_weight(&self, w: &GpuWeight) -> Result<(), GpuError> {
        if w.data.is_none() {
            return Ok(());
        }
        w.windows(self.binding_limit, self.storage_align()).map(|_| ())
    }

    /// Whether the gemm of `w` reads its textures: their lane-group layout
    /// (`WeightTex`) is that of every pass's tile (else it reads the storage
    /// buffers: tiles set by `--gemm-tiles` unlike `GemmTiles::cpu`).
    fn reads_textures(&self, w: &GpuWeight, x: Rows, passes: &[(u32, u32)], silu: bool, rope: bool) -> bool {
        w.tex.first().is_some_and(|t| {
            t.wg == self.tiles.wg
                && passes
                    .iter()
                    .all(|&(_, tm)| self.gemm_variant(w, x, tm, silu, rope).tn == t.tn)
        })
    }

    /// Whether gemms with x in a texture share its texels across lanes
    /// (`GemmVariant::x_lanes`): subgroups of at least 8 lanes and workgroups
    /// of whole groups of 8, so that lanes 0-7 of every subgroup exist. On
    /// lavapipe a texel load is tens of instructions for 8 lanes; one a block
    /// and 32 broadcasts replace eight (default model, `wllm profile`, A/B
    /// twice: decode at 16 rows 112.8-113.4 -> 102.6-104.6 ms a step, a
    /// 512-token prefill 2389-2493 -> 2241-2296 ms). Float weights step four
    /// chunks of 8 at a time there, so their K must be a multiple of 32.
    pub fn x_lanes(&self, format: WeightFormat, k: usize) -> bool {
        (format.is_quantized() || k.is_multiple_of(32))
            && self.ctx.features.contains(wgpu::Features::SUBGROUP)
            && self.ctx.info.subgroup_min_size >= 8
            && self.tiles.wg.is_multiple_of(8)
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
        norm: Option<NormArgs<wgpu::Buffer>>,
    ) -> Result<(), GpuError> {
        self.gemm_rope_kv_passes(enc, w, x, qkv, rope, kv, q_heads, slot_mapping, t, &[(0, tm)], norm)
    }

    /// `gemm_rope_kv` in the row passes given (`row_passes`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_rope_kv_passes(
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
        passes: &[(u32, u32)],
        norm: Option<NormArgs<wgpu::Buffer>>,
    ) -> Result<(), GpuError> {
        let (q_w, kv_w) = (q_heads * kv.head_dim, kv.kv_heads * kv.head_dim);
        if w.n as u32 != q_w + 2 * kv_w || !kv.head_dim.is_multiple_of(2) {
            return Err(GpuError::Limit(format!(
                "gemm_rope_kv: {} weight rows for {q_heads} q heads and {} KV heads of {}",
                w.n, kv.kv_heads, kv.head_dim
            )));
        }
        let kv_tex = self.kv_textures(kv.k_cache, kv.v_cache, kv.kv_rows, kv.dtype)?;
        if kv_tex.is_some() {
            // Caches as textures: the epilogue writes whole texels, groups of
            // 8 W rows; where the tile or windows do not allow it, the gemm
            // and rope_cache_write run one after the other.
            let tn_aligned = passes
                .iter()
                .all(|&(_, tm)| self.gemm_variant(w, x, tm, false, true).tn.is_multiple_of(8));
            let starts: Vec<u32> = if self.cpu_shapes && self.reads_textures(w, x, passes, false, true) {
                w.tex.iter().map(|t| t.row0).collect()
            } else {
                let windows = w.windows(self.binding_limit, self.storage_align())?;
                windows.iter().map(|b| b.row0).collect()
            };
            let aligned = tn_aligned && kv.head_dim.is_multiple_of(8);
            if !aligned || starts.iter().any(|r| !r.is_multiple_of(8)) {
                self.gemm_epilogue(enc, w, x, norm, qkv, t, passes, &Epilogue::Plain)?;
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
        // Halves or q8_0 blocks in a buffer: the epilogue writes y only.
        let halves_in_buffer = kv_tex.is_none() && kv.dtype != KvDtype::F32;
        let ep = Epilogue::Rope {
            rope,
            kv,
            q_w,
            slot_mapping,
            kv_tex,
        };
        self.gemm_epilogue(enc, w, x, norm, qkv, t, passes, &ep)?;
        if halves_in_buffer {
            // The epilogue wrote the rotated rows to qkv only: copy K and V as halves.
            crate::backend::Backend::cache_write(
                self,
                enc,
                qkv,
                q_w,
                q_w + kv_w,
                kv_w,
                slot_mapping,
                kv.k_cache,
                kv.v_cache,
                kv.kv_rows,
                kv.dtype,
                t,
            )?;
        }
        Ok(())
    }

    /// `gemm_silu_mul` with the row tile `tm` chosen by the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_silu_mul_with(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        y: Rows,
        t: u32,
        tm: u32,
        norm: Option<NormArgs<wgpu::Buffer>>,
    ) -> Result<(), GpuError> {
        if !w.n.is_multiple_of(2) {
            return Err(GpuError::Limit(format!(
                "gemm_silu_mul needs interleaved gate/up rows (an even count), got {}",
                w.n
            )));
        }
        self.gemm_epilogue(enc, w, x, norm, y, t, &[(0, tm)], &Epilogue::SiluMul)
    }

    /// The gemm of `t` rows of x with its epilogue, in the row `passes` given
    /// (first row, row tile), window by window.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_epilogue(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        norm: Option<NormArgs<wgpu::Buffer>>,
        y: Rows,
        t: u32,
        passes: &[(u32, u32)],
        ep: &Epilogue,
    ) -> Result<(), GpuError> {
        let silu = matches!(ep, Epilogue::SiluMul);
        let rope = matches!(ep, Epilogue::Rope { .. });
        let tm = passes.first().map_or(1, |&(_, tm)| tm);
        let mut v = self.gemm_variant(w, x, tm, silu, rope);
        // Textures on CPU adapters; the GPU shapes read buffers (and are
        // tested that way on lavapipe too).
        v.w_tex = self.cpu_shapes && self.reads_textures(w, x, passes, silu, rope);
        let x_tex = if v.x_vec { self.x_texture(x, t) } else { None };
        v.x_tex = x_tex.is_some();
        v.x_lanes = v.x_tex && self.x_lanes(w.format, w.k);
        v.residual = matches!(ep, Epilogue::Residual);
        v.norm = norm.is_some();
        // The norm prologue reads x and the norm weight as textures (CPU
        // shapes) or as vec4 buffers (`fuses_norm`).
        let norm_bound = match norm {
            Some(n) if v.x_tex => Some((self.norm_texture(n.w, w.k as u32)?, n.eps)),
            Some(n) if v.x_vec && n.w.size() >= w.k as u64 * 4 => Some((Bound::Buf(BufSlice::whole(n.w)), n.eps)),
            Some(n) => {
                return Err(GpuError::Limit(format!(
                    "a gemm with the rms_norm fused takes x rows of a multiple of 8 floats (4-aligned) and a norm \
                     weight of K floats; got K = {}, stride {}, offset {}, a weight of {} bytes",
                    w.k,
                    x.stride,
                    x.off,
                    n.w.size()
                )));
            }
            None => None,
        };
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
        // (Textures are f32 or f16; in a buffer `kv_f16` means "not f32": the
        // epilogue leaves the cache to cache_write.)
        v.kv_f16 = matches!(ep, Epilogue::Rope { kv, .. } if kv.dtype != KvDtype::F32);
        // Each pass: its rows r0..end, row tile, column tile and kernel.
        let kernels = passes
            .iter()
            .enumerate()
            .map(|(i, &(r0, tm))| {
                let end = passes.get(i + 1).map_or(t, |p| p.0);
                let tn = self.pass_tn(w, x, tm, end - r0, silu, rope);
                let pass = GemmVariant { tm, tn, ..v };
                Ok((r0, end, tm, tn, self.gemm_kernel(pass)?))
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
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
                    None => kv_tex::kv_caches(kv).map(Bound::Buf),
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
            if let Some((g, eps)) = &norm_bound {
                p.eps = *eps;
                bufs.push(g.clone());
            }
            for (i, &(r0, end, tm, tn, ref kernel)) in kernels.iter().enumerate() {
                let cols = rows.div_ceil(tn * v.wg);
                let pass = GemmParams { t: end, r0, ..p };
                let b = if i + 1 == kernels.len() {
                    std::mem::take(&mut bufs)
                } else {
                    bufs.clone()
                };
                enc.dispatch_bound(kernel, bytemuck::bytes_of(&pass), b, [cols, (end - r0).div_ceil(tm), 1]);
            }
        }
        Ok(())
    }
}

/// The row tiles up to `max`: 1 for decodes, 4 / 8 / 16 below it, then `max`.
fn row_tiles_upto(max: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [1, 4, 8, 16].into_iter().filter(|&m| m < max).collect();
    v.push(max);
    v
}

/// `Kernels::row_passes` for `tiles` (ascending), `t` rows and the row tile `tm`.
fn split_rows(tiles: &[u32], t: u32, tm: u32) -> Vec<(u32, u32)> {
    let rest = t % tm;
    let main = t - rest;
    // A 4- or 8-row tile: not the one-row (decode) tile, whose pass reads
    // the weights for one row, about what a 4-row pass costs; and the tiles
    // the engine's warm-up (steps of 4 and 8 rows) compiles for every gemm.
    match tiles.iter().copied().find(|&m| m >= rest.max(4)) {
        Some(small) if main > 0 && rest > 0 && small < tm && small <= 8 => vec![(0, tm), (main, small)],
        _ => vec![(0, tm)],
    }
}

/// `Kernels::pass_tn`: the column tile `tn` halved while `n` columns in
/// workgroups of `wg` lanes over `row_tiles` row tiles make fewer than
/// `min_workgroups` workgroups, down to 1 (2, and even, for the epilogues
/// that take column pairs).
fn narrow_tn(mut tn: u32, n: u32, row_tiles: u32, wg: u32, min_workgroups: u32, pairs: bool) -> u32 {
    let floor = if pairs { 2 } else { 1 };
    while tn > floor && n.div_ceil(tn * wg) * row_tiles < min_workgroups {
        tn = (tn / 2).max(floor).next_multiple_of(floor);
    }
    tn
}

/// `Kernels::row_tile` for `tiles` (ascending), `t` rows and `cols`
/// workgroup columns.
fn pick_row_tile(tiles: &[u32], t: u32, cols: u32, min_workgroups: u32) -> u32 {
    let Some(mut i) = tiles.iter().position(|&m| m >= t) else {
        // More rows than the largest tile holds: the largest (the rows make
        // the workgroups; and the engine's warm-up, whose largest step is
        // 64 rows, compiles the tiles serving uses).
        return *tiles.last().expect("at least one tile");
    };
    while i > 0 && tiles[i - 1] >= 8 && cols * t.div_ceil(tiles[i]) < min_workgroups {
        i -= 1;
    }
    tiles[i]
}

#[cfg(test)]
mod tests {
    use super::{narrow_tn, pick_row_tile, split_rows};

    #[test]
    fn gpu_column_tiles_narrow_until_the_dispatch_has_enough_workgroups() {
        // The default model at 16 rows on a GPU (4-row tiles, 32 lanes): the
        // o / down gemms (576 columns) 5 x 4 workgroups at TN 4, 72 at TN 1.
        assert_eq!(narrow_tn(4, 576, 4, 32, 256, false), 1);
        // The gate·up gemm's column pairs stop at 2 (3072 columns: 192 workgroups).
        assert_eq!(narrow_tn(4, 3072, 4, 32, 256, true), 2);
        // A 512-token prefill has workgroups enough: the tile stays.
        assert_eq!(narrow_tn(4, 576, 128, 32, 256, false), 4);
        assert_eq!(narrow_tn(4, 3072, 128, 32, 256, true), 4);
        // Only as far as needed: 64 rows of 576 columns, 16 row tiles:
        // TN 4 makes 80 workgroups, 2 makes 144, 1 makes 288.
        assert_eq!(narrow_tn(4, 576, 16, 32, 128, false), 2);
        assert_eq!(narrow_tn(4, 576, 16, 32, 256, false), 1);
        // Even tiles for pairs from an even start; no narrowing with a minimum of 1.
        assert_eq!(narrow_tn(6, 960, 1, 32, 1000, true), 2);
        assert_eq!(narrow_tn(8, 8, 1, 64, 1, false), 8);
    }

    #[test]
    fn rows_past_the_last_full_tile_take_a_smaller_tile() {
        let tiles = [1, 4, 8, 16];
        assert_eq!(split_rows(&tiles, 34, 16), vec![(0, 16), (32, 4)]);
        assert_eq!(split_rows(&tiles, 519, 16), vec![(0, 16), (512, 8)]);
        // Whole tiles, one tile, or a rest that needs the full tile: one pass.
        for (t, tm) in [
            (32, 16),
            (512, 16),
            (16, 16),
            (9, 16),
            (1, 1),
            (7, 8),
            (30, 16),
            (12, 4),
        ] {
            assert_eq!(split_rows(&tiles, t, tm), vec![(0, tm)], "t = {t}");
        }
        assert_eq!(split_rows(&tiles, 33, 16), vec![(0, 16), (32, 4)]);
        assert_eq!(split_rows(&tiles, 21, 8), vec![(0, 8)]);
        assert_eq!(split_rows(&tiles, 19, 8), vec![(0, 8), (16, 4)]);
        assert_eq!(split_rows(&tiles, 13, 4), vec![(0, 4)]);
        // Float weights' 32-row tile: a rest of 9 to 16 rows keeps the tile.
        let float_tiles = [1, 4, 8, 16, 32];
        assert_eq!(split_rows(&float_tiles, 45, 32), vec![(0, 32)]);
        assert_eq!(split_rows(&float_tiles, 40, 32), vec![(0, 32), (32, 8)]);
    }

    #[test]
    fn row_tile_holds_the_rows_then_spreads_narrow_gemms() {
        let tiles = [1, 4, 8, 16];
        // Enough workgroups: the smallest tile that holds the rows, else the largest.
        for (t, want) in [(1, 1), (2, 4), (4, 4), (5, 8), (9, 16), (16, 16), (17, 16), (512, 16)] {
            assert_eq!(pick_row_tile(&tiles, t, 100, 6), want, "t = {t}");
        }
        // Three workgroup columns at 16 rows: 8-row tiles make six workgroups.
        assert_eq!(pick_row_tile(&tiles, 16, 3, 6), 8);
        // Never below 8 rows, however few workgroups.
        assert_eq!(pick_row_tile(&tiles, 16, 1, 64), 8);
        assert_eq!(pick_row_tile(&tiles, 8, 1, 64), 8);
        assert_eq!(pick_row_tile(&tiles, 3, 1, 64), 4);
        // Many rows already make enough workgroups; more than the largest
        // tile holds: the largest.
        assert_eq!(pick_row_tile(&tiles, 64, 3, 6), 16);
        assert_eq!(pick_row_tile(&tiles, 20, 1, 64), 16);
        // GPUs (min 1) keep the fitting tile.
        assert_eq!(pick_row_tile(&tiles, 16, 1, 1), 16);
    }
}
