//! The wgpu backend: the ops of the interface as WGSL dispatches of `Kernels`
//! (which owns the pipelines and picks the variants). A step is a
//! `StepEncoder`: every op is recorded, `finish` submits once; the engine's
//! steps reuse their bind groups (`Kernels::bind_cache`).

use super::embed::EmbedParams;
use super::kv_tex::{self, kv_caches, kv_prefix};
use super::weight::scale_pairs;
use super::{GpuWeight, Kernels, PagedKv, Residency, Rows, gemm_ops};
use crate::backend::{
    Activation, Backend, Elementwise, FusedOps, KvDtype, MaskedArgmax, NormArgs, RopeArgs, RopePairing, WeightInfo,
};
use crate::gpu::{Bound, BufSlice, GpuError, StepEncoder};
use crate::quant::{Repacked, WeightFormat};

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
    /// Always 0: paged_attention_blocked.wgsl stores its touch loads' sum only where this is 1.
    touch_sink: u32,
    /// Sliding window (0: none) and score soft-cap (0: none); `PagedKv`.
    window: u32,
    softcap: f32,
    pad: [u32; 2],
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

fn u32s(v: &[u32; 4]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl WeightInfo for GpuWeight {
    fn format(&self) -> WeightFormat {
        self.format
    }
    fn rows(&self) -> usize {
        self.n
    }
    fn cols(&self) -> usize {
        self.k
    }
    fn device_bytes(&self) -> u64 {
        self.gpu_bytes()
    }
}

#[allow(clippy::too_many_arguments)]
impl Backend for Kernels {
    type Buffer = wgpu::Buffer;
    type Weight = GpuWeight;
    type Step = StepEncoder;
    type Error = GpuError;
    type Fused = Kernels;

    fn describe(&self) -> String {
        self.ctx.describe()
    }
    fn sibling(&self) -> Result<Self, GpuError> {
        Kernels::with_tiles(&self.ctx, self.tiles_given.then_some(self.tiles))
    }

    fn max_buffer(&self) -> u64 {
        self.ctx.max_binding()
    }

    fn device_memory(&self) -> Option<crate::gpu::DeviceMemory> {
        self.ctx.memory
    }

    fn shares_host_memory(&self) -> bool {
        self.ctx.is_cpu()
    }

    fn zeros(&self, bytes: u64) -> Result<wgpu::Buffer, GpuError> {
        Ok(self.scratch(bytes))
    }

    fn upload(&self, data: &[u8], label: &str) -> Result<wgpu::Buffer, GpuError> {
        Ok(self.ctx.storage_buffer(data, label))
    }

    fn kv_cache(&self, rows: u64, width: u32, dtype: KvDtype) -> Result<wgpu::Buffer, GpuError> {
        Ok(self.new_kv_cache(rows, width, dtype))
    }

    fn buffer_bytes(&self, b: &wgpu::Buffer) -> u64 {
        b.size()
    }

    fn write(&self, buf: &wgpu::Buffer, data: &[u8]) -> Result<(), GpuError> {
        if data.len() as u64 > buf.size() {
            return Err(GpuError::Limit(format!(
                "write of {} bytes into a buffer of {}",
                data.len(),
                buf.size()
            )));
        }
        if !data.is_empty() {
            self.ctx.queue.write_buffer(buf, 0, data);
        }
        Ok(())
    }

    fn upload_weight(&self, r: &Repacked, label: &str) -> Result<GpuWeight, GpuError> {
        if !r.format.is_narrow() {
            return Ok(GpuWeight::upload_as(&self.ctx, r, label, self.residency()));
        }
        if self.reads_narrow_weights() {
            // Narrow layouts are read from storage buffers (no texture layout).
            return Ok(GpuWeight::upload_as(&self.ctx, r, label, Residency::Buffers));
        }
        let wide = crate::quant::planes::widen(r);
        Ok(GpuWeight::upload_as(&self.ctx, &wide, label, self.residency()))
    }

    fn reads_narrow_weights(&self) -> bool {
        Kernels::reads_narrow_weights(self)
    }

    fn take_device_error(&self) -> Option<GpuError> {
        self.ctx.take_error()
    }

    fn pipeline_stats(&self) -> crate::gpu::PipelineStats {
        Kernels::pipeline_stats(self)
    }

    fn begin(&self) -> StepEncoder {
        StepEncoder::with_cache(&self.ctx, self.bind_cache.clone())
    }

    fn finish(&self, step: StepEncoder, reads: &[(&wgpu::Buffer, u64)]) -> Result<Vec<Vec<u8>>, GpuError> {
        let slices: Vec<BufSlice> = reads.iter().map(|&(b, n)| BufSlice::range(b, 0, n)).collect();
        let out = step.submit_and_read(&slices);
        self.save_pipelines();
        out
    }

    // Pipelines are compiled by the first step that needs them (a one-token
    // generate never builds the decode tiles); `prepare` only checks that the
    // weight can be bound on this adapter.
    fn prepare_gemm(&self, w: &GpuWeight) -> Result<(), GpuError> {
        self.prepare_weight(w)
    }

    fn prepare_embed(&self, w: &GpuWeight) -> Result<(), GpuError> {
        self.prepare_weight(w)
    }

    fn prepare_attention(&self, _head_dim: u32, _heads: u32, _kv_heads: u32) -> Result<(), GpuError> {
        Ok(())
    }

    fn gemm(&self, enc: &mut StepEncoder, w: &GpuWeight, x: Rows, y: Rows, t: u32) -> Result<(), GpuError> {
        self.gemm_epilogue(
            enc,
            w,
            x,
            None,
            y,
            t,
            &self.row_passes(w, t),
            &gemm_ops::Epilogue::Plain,
        )
    }

    fn row_tile_caps(&self, format: WeightFormat) -> Vec<u32> {
        Kernels::row_tile_caps(self, format)
    }

    fn set_row_tile_cap(&self, cap: u32) {
        Kernels::set_row_tile_cap(self, cap);
    }

    fn row_tile_cap(&self) -> u32 {
        Kernels::row_tile_cap(self)
    }

    fn fused(&self) -> Option<&Kernels> {
        Some(self)
    }

    fn rope_cache_write(
        &self,
        enc: &mut StepEncoder,
        qkv: &wgpu::Buffer,
        stride: u32,
        rope: RopeArgs<wgpu::Buffer>,
        kv: PagedKv,
        q_heads: u32,
        slot_mapping: &wgpu::Buffer,
        t: u32,
    ) -> Result<(), GpuError> {
        let (hd, hk) = (kv.head_dim, kv.kv_heads);
        if kv.dtype != KvDtype::F32
            || self
                .kv_textures(kv.k_cache, kv.v_cache, kv.kv_rows, kv.dtype)?
                .is_some()
        {
            // Caches as textures or of halves: rope in place, then cache_write's copy.
            return crate::backend::rope_then_cache_write(self, enc, qkv, stride, rope, kv, q_heads, slot_mapping, t);
        }
        let p = [t, q_heads, hk, hd, stride, rope.pairing as u32, rope.max_pos, 0];
        let [k_cache, v_cache] = kv_caches(&kv);
        let bufs = [
            BufSlice::whole(rope.positions),
            BufSlice::whole(rope.table),
            BufSlice::whole(slot_mapping),
            BufSlice::whole(qkv),
            k_cache,
            v_cache,
        ];
        enc.dispatch(
            &self.rope_cache_write,
            bytemuck::cast_slice(&p),
            &bufs,
            [((q_heads + hk) * hd / 2).div_ceil(64), t, 1],
        );
        Ok(())
    }

    fn embed(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        ids: &wgpu::Buffer,
        t: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let tex = w.data.is_none();
        let kernel = self.embed_kernel(w.format, tex)?;
        let base = EmbedParams {
            t,
            d: w.k as u32,
            chunks: w.chunks() as u32,
            w_row: w.w_row() as u32,
            vocab: w.n as u32,
            ..EmbedParams::default()
        };
        // Each window: its rows, parameters and bindings.
        let windows: Vec<(EmbedParams, Vec<Bound>)> = if tex {
            let scale_units = if scale_pairs(w.format) {
                w.chunks().div_ceil(2)
            } else {
                w.chunks()
            } as u32;
            w.tex
                .iter()
                .map(|t| {
                    let p = EmbedParams {
                        row0: t.row0,
                        rows: t.rows,
                        tn: t.tn,
                        wg: t.wg,
                        parts: w.tex_parts(),
                        scale_units,
                        ..base
                    };
                    (
                        p,
                        [Some(t.data.clone()), t.scales.clone()].into_iter().flatten().collect(),
                    )
                })
                .collect()
        } else {
            w.windows(self.binding_limit, self.storage_align())?
                .into_iter()
                .map(|win| {
                    let p = EmbedParams {
                        row0: win.row0,
                        rows: win.rows,
                        ..base
                    };
                    (
                        p,
                        [Some(win.data), win.scales]
                            .into_iter()
                            .flatten()
                            .map(Bound::Buf)
                            .collect(),
                    )
                })
                .collect()
        };
        for (p, wb) in windows {
            let mut bufs = vec![Bound::Buf(BufSlice::whole(ids))];
            bufs.extend(wb);
            bufs.push(Bound::Buf(BufSlice::whole(out)));
            enc.dispatch_bound(
                &kernel,
                bytemuck::bytes_of(&p),
                bufs,
                [(w.chunks() as u32).div_ceil(64), t, 1],
            );
        }
        Ok(())
    }

    fn rms_norm(
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
    ) -> Result<(), GpuError> {
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
        Ok(())
    }

    fn rope(
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
    ) -> Result<(), GpuError> {
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
        Ok(())
    }

    fn act_mul(
        &self,
        enc: &mut StepEncoder,
        gu: &wgpu::Buffer,
        out: &wgpu::Buffer,
        t: u32,
        inter: u32,
        act: Activation,
    ) -> Result<(), GpuError> {
        let bufs = [BufSlice::whole(gu), BufSlice::whole(out)];
        enc.dispatch(
            &self.act_mul,
            u32s(&[t, inter, act as u32, 0]),
            &bufs,
            [inter.div_ceil(64), t, 1],
        );
        Ok(())
    }

    fn add_bias(&self, enc: &mut StepEncoder, x: Rows, bias: &wgpu::Buffer, n: u32, t: u32) -> Result<(), GpuError> {
        let bufs = [BufSlice::whole(bias), BufSlice::whole(x.buf)];
        let p = [t, n, x.stride, x.off];
        enc.dispatch(&self.arch_kernel("bias_add")?, u32s(&p), &bufs, [n.div_ceil(64), t, 1]);
        Ok(())
    }

    fn head_norm(
        &self,
        enc: &mut StepEncoder,
        x: Rows,
        w: &wgpu::Buffer,
        eps: f32,
        heads: u32,
        head_dim: u32,
        t: u32,
    ) -> Result<(), GpuError> {
        let p = [t, heads, head_dim, x.stride, x.off, eps.to_bits(), 0, 0];
        let bufs = [BufSlice::whole(w), BufSlice::whole(x.buf)];
        enc.dispatch(
            &self.arch_kernel("head_norm")?,
            bytemuck::cast_slice(&p),
            &bufs,
            [heads, t, 1],
        );
        Ok(())
    }

    fn elementwise(&self, enc: &mut StepEncoder, x: &wgpu::Buffer, n: u32, op: Elementwise) -> Result<(), GpuError> {
        let (code, a) = match op {
            Elementwise::Scale(a) => (0u32, a),
            Elementwise::Softcap(a) => (1, a),
        };
        let p = [n, code, a.to_bits(), 0];
        let bufs = [BufSlice::whole(x)];
        enc.dispatch(
            &self.arch_kernel("elementwise")?,
            u32s(&p),
            &bufs,
            [n.div_ceil(64).clamp(1, 4096), 1, 1],
        );
        Ok(())
    }

    fn cache_write(
        &self,
        enc: &mut StepEncoder,
        qkv: Rows,
        k_off: u32,
        v_off: u32,
        kv_width: u32,
        slot_mapping: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        kv_rows: u32,
        dtype: KvDtype,
        t: u32,
    ) -> Result<(), GpuError> {
        if let Some([kt, vt]) = self.kv_textures(k_cache, v_cache, kv_rows, dtype)? {
            let p = [
                t,
                kv_width,
                qkv.stride,
                k_off + qkv.off,
                v_off + qkv.off,
                kv_tex::SLOTS_PER_LAYER,
                0,
                0,
            ];
            let bufs = vec![
                Bound::Buf(BufSlice::whole(qkv.buf)),
                Bound::Buf(BufSlice::whole(slot_mapping)),
                kt,
                vt,
            ];
            enc.dispatch_bound(
                &self.cache_write_kernel(true, dtype)?,
                bytemuck::cast_slice(&p),
                bufs,
                [(kv_width / 4).div_ceil(64), t, 1],
            );
            return Ok(());
        }
        if !kv_width.is_multiple_of(dtype.row_multiple()) {
            return Err(GpuError::Limit(format!(
                "a {dtype} KV cache holds rows of whole multiples of {} values: kv_width {kv_width} is not one",
                dtype.row_multiple()
            )));
        }
        let p = [t, kv_width, qkv.stride, k_off + qkv.off, v_off + qkv.off, 0, 0, 0];
        let row_bytes = dtype.row_bytes(u64::from(kv_width));
        let bufs = [
            BufSlice::whole(qkv.buf),
            BufSlice::whole(slot_mapping),
            kv_prefix(k_cache, kv_rows, row_bytes),
            kv_prefix(v_cache, kv_rows, row_bytes),
        ];
        // One invocation an element (f32), a pair of halves (f16) or a block (q8_0).
        let per = dtype.row_multiple();
        enc.dispatch(
            &self.cache_write_kernel(false, dtype)?,
            bytemuck::cast_slice(&p),
            &bufs,
            [(kv_width / per).div_ceil(64), t, 1],
        );
        Ok(())
    }

    fn paged_attention(
        &self,
        enc: &mut StepEncoder,
        q: &wgpu::Buffer,
        q_stride: u32,
        kv: PagedKv,
        heads: u32,
        t: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let mut v = self.attention_variant(kv.head_dim, heads / kv.kv_heads.max(1), t, kv.max_query_len);
        let kv_bound = match self.kv_textures(kv.k_cache, kv.v_cache, kv.kv_rows, kv.dtype)? {
            Some(tex) => tex,
            None => kv_caches(&kv).map(Bound::Buf),
        };
        v.kv_tex = matches!(kv_bound[0], Bound::Tex { .. });
        v.f16 = kv.dtype == KvDtype::F16;
        v.q8 = kv.dtype == KvDtype::Q8_0;
        v.window = kv.window > 0;
        v.softcap = kv.softcap > 0.0;
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
            scale: kv.scale,
            touch_sink: 0,
            window: kv.window,
            softcap: kv.softcap,
            pad: [0; 2],
        };
        let [k_cache, v_cache] = kv_bound;
        let bufs = vec![
            Bound::Buf(BufSlice::whole(q)),
            k_cache,
            v_cache,
            Bound::Buf(BufSlice::whole(kv.positions)),
            Bound::Buf(BufSlice::whole(kv.token_seq)),
            Bound::Buf(BufSlice::whole(kv.block_tables)),
            Bound::Buf(BufSlice::whole(out)),
        ];
        enc.dispatch_bound(
            &kernel,
            bytemuck::bytes_of(&p),
            bufs,
            [heads / v.g, t.div_ceil(v.qt), 1],
        );
        Ok(())
    }

    fn argmax(
        &self,
        enc: &mut StepEncoder,
        x: &wgpu::Buffer,
        n: u32,
        rows: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let bufs = [BufSlice::whole(x), BufSlice::whole(out)];
        enc.dispatch(&self.argmax_kernel()?, u32s(&[rows, n, 0, 0]), &bufs, [rows, 1, 1]);
        Ok(())
    }

    fn masked_argmax(&self, enc: &mut StepEncoder, a: MaskedArgmax<'_, wgpu::Buffer>) -> Result<(), GpuError> {
        let bufs = [
            BufSlice::whole(a.x),
            BufSlice::whole(a.mask),
            BufSlice::whole(a.rows),
            BufSlice::whole(a.out),
        ];
        let p = [a.count, a.n, a.words, 0];
        enc.dispatch(&self.masked_argmax, u32s(&p), &bufs, [a.count, 1, 1]);
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
impl FusedOps<Kernels> for Kernels {
    fn fuses_gate_up(&self) -> bool {
        true
    }

    fn fuses_norm(&self, d: u32) -> bool {
        Kernels::fuses_norm(self, d)
    }

    fn gemm_residual(&self, enc: &mut StepEncoder, w: &GpuWeight, x: Rows, y: Rows, t: u32) -> Result<(), GpuError> {
        self.gemm_epilogue(
            enc,
            w,
            x,
            None,
            y,
            t,
            &self.row_passes(w, t),
            &gemm_ops::Epilogue::Residual,
        )
    }

    fn gemm_silu_mul(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        norm: Option<NormArgs<wgpu::Buffer>>,
        out: Rows,
        t: u32,
    ) -> Result<(), GpuError> {
        self.gemm_epilogue(
            enc,
            w,
            x,
            norm,
            out,
            t,
            &self.row_passes(w, t),
            &gemm_ops::Epilogue::SiluMul,
        )
    }

    fn fuses_qkv_rope(&self) -> bool {
        Kernels::fuses_qkv_rope(self)
    }

    fn gemm_rope_kv(
        &self,
        enc: &mut StepEncoder,
        w: &GpuWeight,
        x: Rows,
        norm: Option<NormArgs<wgpu::Buffer>>,
        qkv: Rows,
        rope: RopeArgs<wgpu::Buffer>,
        kv: PagedKv,
        q_heads: u32,
        slot_mapping: &wgpu::Buffer,
        t: u32,
    ) -> Result<(), GpuError> {
        let passes = self.row_passes(w, t);
        self.gemm_rope_kv_passes(enc, w, x, qkv, rope, kv, q_heads, slot_mapping, t, &passes, norm)
    }
}
