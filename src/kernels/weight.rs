//! A weight matrix resident on the GPU in the layout of `quant::repack`.

use wgpu::util::DeviceExt;

use super::gemm::w_row_len;
use crate::gpu::GpuContext;
use crate::quant::{Repacked, WeightFormat};

/// `W[n][k]` on the GPU.
#[derive(Clone, Debug)]
pub struct GpuWeight {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    // data: (n, w_row) vec4 elements of the format's layout
    pub data: wgpu::Buffer,
    // scales: (n, k/32) f32 or vec2<f32>; quantised formats only
    pub scales: Option<wgpu::Buffer>,
}

impl GpuWeight {
    /// Uploads a repacked matrix.
    pub fn upload(ctx: &GpuContext, r: &Repacked, label: &str) -> Self {
        let mk = |bytes: &[u8]| {
            // wgpu needs a non-empty, 4-byte-multiple buffer.
            let mut v = bytes.to_vec();
            v.resize(v.len().max(16).div_ceil(4) * 4, 0);
            ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &v,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            })
        };
        Self {
            format: r.format,
            n: r.n,
            k: r.k,
            data: mk(&r.data),
            scales: r.format.is_quantized().then(|| mk(&r.scales)),
        }
    }

    /// `w` array elements per row (see gemm.wgsl).
    pub fn w_row(&self) -> usize {
        w_row_len(self.format, self.k)
    }

    /// 8-element chunks (floats) or 32-element blocks (quantised) per row.
    pub fn chunks(&self) -> usize {
        if self.format.is_quantized() {
            self.k / 32
        } else {
            self.k.div_ceil(8)
        }
    }

    /// Bytes this weight occupies on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.data.size() + self.scales.as_ref().map_or(0, |s| s.size())
    }

    /// Bytes of the weight as stored (what a decode step must read).
    pub fn stored_bytes(&self) -> usize {
        self.format.stored_bytes(self.n, self.k)
    }
}
