//! The ops interface on the cuda backend: buffers, steps, and one launch per op
//! with the grid each kernel file's header states.

use super::CudaError;
use super::exec::Arg::{self, F32, Ptr, U32};
use super::program::format_suffix;
use super::{CudaBackend, CudaBuffer, CudaStep, CudaWeight};
use crate::backend::{Activation, Backend, Elementwise, KvDtype, MaskedArgmax, PagedKv, RopePairing, Rows, Unfused};
use crate::quant::Repacked;

/// Grid dimensions y and z are limited to 65535 blocks.
const MAX_GRID_Y: u32 = 65535;

fn check_rows(t: u32, what: &str) -> Result<(), CudaError> {
    if t > MAX_GRID_Y {
        return Err(CudaError::Limit(format!(
            "{what} over {t} rows: the cuda backend takes at most {MAX_GRID_Y} rows per step \
             (lower --max-num-batched-tokens)"
        )));
    }
    Ok(())
}

impl CudaBackend {
    /// Launches kernel `name` (nothing for an empty grid).
    pub(super) fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        self.exec.launch(name, grid, block, args)
    }
}

fn opt_ptr(b: Option<&CudaBuffer>) -> Arg {
    Ptr(b.map_or(0, |b| b.ptr()))
}

#[allow(clippy::too_many_arguments)]
impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Weight = CudaWeight;
    type Step = CudaStep;
    type Error = CudaError;
    type Fused = Unfused;

    fn describe(&self) -> String {
        CudaBackend::describe(self)
    }
    fn sibling(&self) -> Result<Self, CudaError> {
        Ok(CudaBackend::sibling(self))
    }

    fn max_buffer(&self) -> u64 {
        self.exec.total_mem()
    }

    fn device_memory(&self) -> Option<crate::gpu::DeviceMemory> {
        Some(crate::gpu::DeviceMemory {
            total: self.exec.total_mem(),
            available: self.exec.free_mem(),
        })
    }

    fn zeros(&self, bytes: u64) -> Result<CudaBuffer, CudaError> {
        self.alloc(bytes)
    }

    fn upload(&self, data: &[u8], _label: &str) -> Result<CudaBuffer, CudaError> {
        self.upload_bytes(data)
    }

    fn buffer_bytes(&self, b: &CudaBuffer) -> u64 {
        b.len()
    }

    fn write(&self, buf: &CudaBuffer, data: &[u8]) -> Result<(), CudaError> {
        if data.len() as u64 > buf.len() {
            return Err(CudaError::Limit(format!(
                "write of {} bytes into a buffer of {}",
                data.len(),
                buf.len()
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.exec.write(buf.ptr(), data)
    }

    fn upload_weight(&self, r: &Repacked, _label: &str) -> Result<CudaWeight, CudaError> {
        // The CUDA kernels read the wide layouts (`reads_narrow_weights` false).
        let wide;
        let r = if r.format.is_narrow() {
            wide = crate::quant::planes::widen(r);
            &wide
        } else {
            r
        };
        Ok(CudaWeight {
            format: r.format,
            n: r.n,
            k: r.k,
            kp: r.kp,
            data: self.upload_bytes(&r.data)?,
            scales: if r.format.is_quantized() {
                Some(self.upload_bytes(&r.scales)?)
            } else {
                None
            },
        })
    }

    fn prepare_gemm(&self, w: &CudaWeight) -> Result<(), CudaError> {
        self.reserve_dequant(w)
    }

    fn prepare_embed(&self, _w: &CudaWeight) -> Result<(), CudaError> {
        Ok(())
    }

    fn prepare_attention(&self, head_dim: u32, heads: u32, kv_heads: u32) -> Result<(), CudaError> {
        check_heads(head_dim, heads, kv_heads)
    }

    fn begin(&self) -> CudaStep {
        CudaStep { _private: () }
    }

    fn finish(&self, _step: CudaStep, reads: &[(&CudaBuffer, u64)]) -> Result<Vec<Vec<u8>>, CudaError> {
        let out = reads
            .iter()
            .map(|&(b, n)| self.read(b, n))
            .collect::<Result<Vec<_>, _>>()?;
        self.exec.synchronize()?;
        Ok(out)
    }

    fn gemm(
        &self,
        _s: &mut CudaStep,
        w: &CudaWeight,
        x: Rows<CudaBuffer>,
        y: Rows<CudaBuffer>,
        t: u32,
    ) -> Result<(), CudaError> {
        self.gemm_rows(w, x, y, t)
    }

    fn fused(&self) -> Option<&Unfused> {
        None
    }

    fn embed(
        &self,
        _s: &mut CudaStep,
        w: &CudaWeight,
        ids: &CudaBuffer,
        t: u32,
        out: &CudaBuffer,
    ) -> Result<(), CudaError> {
        let args = [
            Ptr(ids.ptr()),
            Ptr(w.data.ptr()),
            opt_ptr(w.scales.as_ref()),
            Ptr(out.ptr()),
            U32(t),
            U32(w.k as u32),
            U32(w.kp as u32),
            U32(w.n as u32),
        ];
        self.launch(&format!("embed_{}", format_suffix(w.format)), (t, 1, 1), 256, &args)
    }

    fn rms_norm(
        &self,
        _s: &mut CudaStep,
        x: Rows<CudaBuffer>,
        w: &CudaBuffer,
        residual: Option<&CudaBuffer>,
        rows: Option<&CudaBuffer>,
        eps: f32,
        t: u32,
        d: u32,
        y: &CudaBuffer,
    ) -> Result<(), CudaError> {
        let args = [
            Ptr(x.buf.ptr()),
            Ptr(w.ptr()),
            opt_ptr(residual),
            opt_ptr(rows),
            Ptr(y.ptr()),
            U32(t),
            U32(d),
            F32(eps),
            U32(residual.is_some() as u32),
            U32(rows.is_some() as u32),
        ];
        self.launch("rms_norm", (t, 1, 1), 256, &args)
    }

    fn rope(
        &self,
        _s: &mut CudaStep,
        x: &CudaBuffer,
        stride: u32,
        positions: &CudaBuffer,
        table: &CudaBuffer,
        max_pos: u32,
        t: u32,
        heads: u32,
        head_dim: u32,
        pairing: RopePairing,
    ) -> Result<(), CudaError> {
        check_rows(t, "rope")?;
        let args = [
            Ptr(positions.ptr()),
            Ptr(table.ptr()),
            Ptr(x.ptr()),
            U32(t),
            U32(heads),
            U32(head_dim),
            U32(stride),
            U32(pairing as u32),
            U32(max_pos.max(1)),
        ];
        self.launch("rope", ((heads * head_dim / 2).div_ceil(256), t, 1), 256, &args)
    }

    fn act_mul(
        &self,
        _s: &mut CudaStep,
        gu: &CudaBuffer,
        out: &CudaBuffer,
        t: u32,
        inter: u32,
        act: Activation,
    ) -> Result<(), CudaError> {
        check_rows(t, "act_mul")?;
        let args = [Ptr(gu.ptr()), Ptr(out.ptr()), U32(t), U32(inter), U32(act as u32)];
        self.launch("act_mul", (inter.div_ceil(256), t, 1), 256, &args)
    }

    fn add_bias(
        &self,
        _s: &mut CudaStep,
        x: Rows<CudaBuffer>,
        bias: &CudaBuffer,
        n: u32,
        t: u32,
    ) -> Result<(), CudaError> {
        check_rows(t, "add_bias")?;
        let args = [
            Ptr(bias.ptr()),
            Ptr(x.buf.ptr()),
            U32(t),
            U32(n),
            U32(x.stride),
            U32(x.off),
        ];
        self.launch("bias_add", (n.div_ceil(256), t, 1), 256, &args)
    }

    fn head_norm(
        &self,
        _s: &mut CudaStep,
        x: Rows<CudaBuffer>,
        w: &CudaBuffer,
        eps: f32,
        heads: u32,
        head_dim: u32,
        t: u32,
    ) -> Result<(), CudaError> {
        check_rows(t, "head_norm")?;
        let args = [
            Ptr(w.ptr()),
            Ptr(x.buf.ptr()),
            U32(t),
            U32(heads),
            U32(head_dim),
            U32(x.stride),
            U32(x.off),
            F32(eps),
        ];
        self.launch("head_norm", (heads, t, 1), 256, &args)
    }

    fn elementwise(&self, _s: &mut CudaStep, x: &CudaBuffer, n: u32, op: Elementwise) -> Result<(), CudaError> {
        let (code, a) = match op {
            Elementwise::Scale(a) => (0u32, a),
            Elementwise::Softcap(a) => (1, a),
        };
        let args = [Ptr(x.ptr()), U32(n), U32(code), F32(a)];
        self.launch("elementwise", (n.div_ceil(256).clamp(1, 4096), 1, 1), 256, &args)
    }

    fn cache_write(
        &self,
        _s: &mut CudaStep,
        qkv: Rows<CudaBuffer>,
        k_off: u32,
        v_off: u32,
        kv_width: u32,
        slot_mapping: &CudaBuffer,
        k_cache: &CudaBuffer,
        v_cache: &CudaBuffer,
        _kv_rows: u32,
        dtype: KvDtype,
        t: u32,
    ) -> Result<(), CudaError> {
        check_rows(t, "cache_write")?;
        if !kv_width.is_multiple_of(dtype.row_multiple()) {
            return Err(CudaError::Limit(format!(
                "a {dtype} KV cache holds rows of whole multiples of {} values: kv_width {kv_width} is not one",
                dtype.row_multiple()
            )));
        }
        let args = [
            Ptr(qkv.buf.ptr()),
            Ptr(slot_mapping.ptr()),
            Ptr(k_cache.ptr()),
            Ptr(v_cache.ptr()),
            U32(t),
            U32(kv_width),
            U32(qkv.stride),
            U32(k_off),
            U32(v_off),
            U32(kv_dtype_code(dtype)),
        ];
        self.launch("cache_write", (kv_width.div_ceil(256), t, 1), 256, &args)
    }

    fn paged_attention(
        &self,
        _s: &mut CudaStep,
        q: &CudaBuffer,
        q_stride: u32,
        kv: PagedKv<CudaBuffer>,
        heads: u32,
        t: u32,
        out: &CudaBuffer,
    ) -> Result<(), CudaError> {
        check_heads(kv.head_dim, heads, kv.kv_heads)?;
        check_rows(t, "paged_attention")?;
        let q_stride = if q_stride == u32::MAX {
            heads * kv.head_dim
        } else {
            q_stride
        };
        let args = [
            Ptr(q.ptr()),
            Ptr(kv.k_cache.ptr()),
            Ptr(kv.v_cache.ptr()),
            Ptr(kv.positions.ptr()),
            Ptr(kv.token_seq.ptr()),
            Ptr(kv.block_tables.ptr()),
            Ptr(out.ptr()),
            U32(t),
            U32(heads),
            U32(kv.kv_heads),
            U32(kv.head_dim),
            U32(q_stride),
            U32(kv.block_size),
            U32(kv.max_blocks),
            F32(kv.scale),
            U32(kv.window),
            F32(kv.softcap),
            U32(kv_dtype_code(kv.dtype)),
        ];
        self.launch("paged_attention", (heads, t, 1), 256, &args)
    }

    fn argmax(&self, _s: &mut CudaStep, x: &CudaBuffer, n: u32, rows: u32, out: &CudaBuffer) -> Result<(), CudaError> {
        let args = [Ptr(x.ptr()), Ptr(out.ptr()), U32(rows), U32(n)];
        self.launch("argmax", (rows, 1, 1), 256, &args)
    }

    fn masked_argmax(&self, _s: &mut CudaStep, a: MaskedArgmax<'_, CudaBuffer>) -> Result<(), CudaError> {
        let args = [
            Ptr(a.x.ptr()),
            Ptr(a.mask.ptr()),
            Ptr(a.rows.ptr()),
            Ptr(a.out.ptr()),
            U32(a.count),
            U32(a.n),
            U32(a.words),
        ];
        self.launch("masked_argmax", (a.count, 1, 1), 256, &args)
    }
}

/// The head shapes `paged_attention.cu` serves: head_dim ≤ 256, whole GQA groups.
pub fn check_heads(head_dim: u32, heads: u32, kv_heads: u32) -> Result<(), CudaError> {
    if head_dim == 0 || head_dim > 256 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(CudaError::Limit(format!(
            "the cuda paged_attention serves head_dim 1..=256 with heads a multiple of kv_heads; \
             got head_dim {head_dim}, {heads} heads, {kv_heads} KV heads (use --device wgpu)"
        )));
    }
    Ok(())
}

/// A KV cache dtype as the kernels name it (shaders/cuda/common.cuh's KV_*).
fn kv_dtype_code(dtype: KvDtype) -> u32 {
    match dtype {
        KvDtype::F32 => 0,
        KvDtype::F16 => 1,
        KvDtype::Q8_0 => 2,
    }
}
