//! The gemm op on cuda: the batch-invariant `gemm.cu` kernel for small T
//! (decodes), cuBLAS SGEMM from `cublas_min_t` rows (prefill), on the weight
//! itself (f32) or on an f32 copy dequantised just before (other formats).

use super::CudaError;
use super::exec::Arg::{Ptr, U32};
use super::program::format_suffix;
use super::{CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::Rows;
use crate::quant::WeightFormat;

/// Rows per block of `gemm.cu` (GEMM_TM) and output columns per block (warps).
const TM: u32 = 4;
const COLS_PER_BLOCK: u32 = 8;
/// Most rows of one `dequant` launch (grid y).
const DEQUANT_ROWS: usize = 65535;

impl CudaBackend {
    /// Grows the f32 scratch of the cuBLAS path to hold `w` (non-f32 formats).
    pub(super) fn reserve_dequant(&self, w: &CudaWeight) -> Result<(), CudaError> {
        let mut slot = self.dequant.lock().unwrap_or_else(|e| e.into_inner());
        self.grow_dequant(&mut slot, w)
    }

    fn grow_dequant(&self, slot: &mut Option<CudaBuffer>, w: &CudaWeight) -> Result<(), CudaError> {
        let need = (w.n * w.kp * 4) as u64;
        if w.format != WeightFormat::F32 && slot.as_ref().is_none_or(|b| b.len() < need) {
            *slot = Some(self.alloc(need)?);
        }
        Ok(())
    }

    /// Y[t, :N] = X[t, :K] · Wᵀ.
    pub(super) fn gemm_rows(
        &self,
        w: &CudaWeight,
        x: Rows<CudaBuffer>,
        y: Rows<CudaBuffer>,
        t: u32,
    ) -> Result<(), CudaError> {
        if t >= self.cublas_min_t && self.cublas_min_t > 0 {
            return self.gemm_cublas(w, x, y, t);
        }
        let grid = ((w.n as u32).div_ceil(COLS_PER_BLOCK), t.div_ceil(TM), 1);
        if grid.1 > 65535 {
            return Err(CudaError::Limit(format!("gemm over {t} rows exceeds the cuda grid")));
        }
        let args = [
            Ptr(x.buf.ptr()),
            Ptr(w.data.ptr()),
            Ptr(w.scales.as_ref().map_or(0, |s| s.ptr())),
            Ptr(y.buf.ptr()),
            U32(t),
            U32(w.n as u32),
            U32(w.k as u32),
            U32(w.kp as u32),
            U32(x.stride),
            U32(y.stride),
            U32(x.off),
            U32(y.off),
        ];
        self.launch(&format!("gemm_{}", format_suffix(w.format)), grid, 256, &args)
    }

    fn gemm_cublas(&self, w: &CudaWeight, x: Rows<CudaBuffer>, y: Rows<CudaBuffer>, t: u32) -> Result<(), CudaError> {
        let mut slot = self.dequant.lock().unwrap_or_else(|e| e.into_inner());
        self.grow_dequant(&mut slot, w)?;
        let a = if w.format == WeightFormat::F32 {
            w.data.ptr()
        } else {
            let scratch = slot
                .as_ref()
                .ok_or_else(|| CudaError::Driver("dequant scratch missing".into()))?;
            let name = format!("dequant_{}", format_suffix(w.format));
            for row0 in (0..w.n).step_by(DEQUANT_ROWS) {
                let rows = (w.n - row0).min(DEQUANT_ROWS);
                let args = [
                    Ptr(w.data.ptr()),
                    Ptr(w.scales.as_ref().map_or(0, |s| s.ptr())),
                    Ptr(scratch.ptr() + (row0 * w.kp * 4) as u64),
                    U32(row0 as u32),
                    U32(rows as u32),
                    U32(w.k as u32),
                    U32(w.kp as u32),
                ];
                self.launch(&name, ((w.kp as u32).div_ceil(256), rows as u32, 1), 256, &args)?;
            }
            scratch.ptr()
        };
        // Column-major view: Yᵀ (N x T, ld y_stride) = (W as stored: K x N, ld Kp)ᵀ · Xᵀ (K x T, ld x_stride).
        let b = x.buf.ptr() + u64::from(x.off) * 4;
        let c = y.buf.ptr() + u64::from(y.off) * 4;
        self.exec
            .sgemm_tn(w.n as u32, t, w.k as u32, a, w.kp as u32, b, x.stride, c, y.stride)
    }
}
