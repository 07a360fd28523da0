//! A weight format's dequant roof (benchmarks only): how fast this adapter
//! reads a weight in the gemm's texture layout and widens it into f32
//! multiply-adds with nothing else to do (`shaders/bench/dequant_roof.wgsl`:
//! the decode GEMV's texel walk and dequantisation, x in registers, no
//! reduction order). A decode GEMV is bound by the lower of the read roof and
//! this one; on CPU adapters the quantised formats' dequant roof is the lower,
//! and `cargo bench --bench kernels` prints each GEMV's share of both
//! (`DequantRoof`).

use std::sync::Arc;

use minijinja::context;

use super::roofs::time_reps;
use super::templates::render;
use super::weight::{WeightTex, scale_binding, scale_pairs};
use super::{GpuWeight, Kernels};
use crate::gpu::{Binding, Bound, BufSlice, GpuError, Kernel, StepEncoder};

/// The kernel for a weight uploaded as textures (`GpuWeight::tex`), or
/// `None` where it has none (GPU adapters) or, for floats, K is not a
/// multiple of 32.
fn kernel(ks: &Kernels, w: &GpuWeight) -> Result<Option<Arc<Kernel>>, GpuError> {
    let Some(t) = w.tex.first() else {
        return Ok(None);
    };
    let q = w.format.is_quantized();
    if !q && !w.k.is_multiple_of(32) {
        return Ok(None);
    }
    let format = w.format.layout();
    let source = render(
        "bench/dequant_roof.wgsl",
        context! {
            format => format!("{format:?}"),
            quantized => q,
            tn => t.tn,
            wg => t.wg,
            scale_texel => scale_binding(format).wgsl_texel(),
            pairs => scale_pairs(format),
        },
    )?;
    let storage: Vec<Binding> = if q {
        vec![
            Binding::LoadRgba32Uint,
            scale_binding(format),
            Binding::Read,
            Binding::ReadWrite,
        ]
    } else {
        vec![Binding::LoadRgba32Uint, Binding::Read, Binding::ReadWrite]
    };
    let name = format!("dequant_roof_{format:?}_{}x{}", t.tn, t.wg);
    // (The device's store: compiled once a format however many weights.)
    ks.store.kernel(&ks.ctx.device, &name, &source, &storage).map(Some)
}

/// x of one block (32 values: element k of every row is multiplied by
/// `roof_x()[k % 32]`): values that keep every sum finite and far from zero.
pub fn roof_x() -> [f32; 32] {
    std::array::from_fn(|i| 0.5 + i as f32 / 64.0)
}

/// The roof of one weight: its kernel, x and a sums buffer a texture window.
pub struct DequantRoof<'a> {
    ks: &'a Kernels,
    w: &'a GpuWeight,
    kernel: Arc<Kernel>,
    xv: wgpu::Buffer,
    outs: Vec<wgpu::Buffer>,
}

/// Workgroups of a window's dispatch (as the GEMV's at one row).
fn groups(t: &WeightTex) -> u32 {
    t.rows.div_ceil(t.tn * t.wg)
}

impl<'a> DequantRoof<'a> {
    /// The roof of `w`, compiled; `None` where it has no textures (GPU
    /// adapters) or, for floats, K is not a multiple of 32.
    pub fn new(ks: &'a Kernels, w: &'a GpuWeight) -> Result<Option<Self>, GpuError> {
        let Some(kernel) = kernel(ks, w)? else {
            return Ok(None);
        };
        let xv = ks.ctx.storage_buffer(bytemuck::cast_slice(&roof_x()), "dequant roof x");
        let outs = w
            .tex
            .iter()
            .map(|t| ks.scratch(u64::from(groups(t) * t.wg) * 4))
            .collect();
        Ok(Some(Self {
            ks,
            w,
            kernel,
            xv,
            outs,
        }))
    }

    /// One pass over all of the weight: a dispatch a texture window, each
    /// writing its invocations' sums to its own buffer.
    fn record(&self, enc: &mut StepEncoder) {
        let params = [self.w.chunks() as u32, 0, 0, 0];
        for (t, out) in self.w.tex.iter().zip(&self.outs) {
            let mut bufs: Vec<Bound> = [Some(t.data.clone()), t.scales.clone()].into_iter().flatten().collect();
            bufs.push(Bound::Buf(BufSlice::whole(&self.xv)));
            bufs.push(Bound::Buf(BufSlice::whole(out)));
            enc.dispatch_bound(&self.kernel, bytemuck::cast_slice(&params), bufs, [groups(t), 1, 1]);
        }
    }

    /// Seconds one pass takes: the median of `reps`-long submissions.
    pub fn seconds(&self, reps: usize) -> Result<f64, GpuError> {
        Self::seconds_of(self.ks, std::slice::from_ref(self), reps)
    }

    /// Seconds one pass over each of `roofs` in turn takes (a dispatch a
    /// texture window each, as a one-row step's gemms): the median of
    /// `reps`-long submissions.
    pub fn seconds_of(ks: &Kernels, roofs: &[DequantRoof], reps: usize) -> Result<f64, GpuError> {
        time_reps(&ks.ctx, reps, |enc| {
            roofs.iter().for_each(|r| r.record(enc));
            Ok(())
        })
    }

    /// What one pass writes, window by window: invocation `g·wg + l` (group
    /// g, lane l) holds Σ over its rows `g·tn·wg + l·tn + j` (j < tn, those
    /// of the window) of Σ_k W[row, k] · `roof_x()[k % 32]`, so a test can
    /// check that the roof reads and dequantises every weight once.
    pub fn lane_sums(&self) -> Result<Vec<Vec<f32>>, GpuError> {
        let mut enc = StepEncoder::new(&self.ks.ctx);
        self.record(&mut enc);
        let reads: Vec<BufSlice> = self.outs.iter().map(BufSlice::whole).collect();
        let read = enc.submit_and_read(&reads)?;
        Ok(read.iter().map(|b| bytemuck::pod_collect_to_vec(b)).collect())
    }
}
