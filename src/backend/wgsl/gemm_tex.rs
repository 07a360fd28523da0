//! What the CPU-adapter gemms read as textures besides their weights (a
//! texel load serves eight lanes at once on llvmpipe, a storage load goes lane
//! by lane): the x rows, copied into a texture in the step before each gemm,
//! and the rms_norm weights of the fused norm prologue, uploaded once.

use super::{Bound, GpuError, Kernels, Rows};

/// An rgba32float 2D texture of `width` texels by `height` rows, sampled by
/// the gemm and filled by copies (x rows, norm weights).
fn f32_texture(device: &wgpu::Device, label: &str, width: u32, height: u32) -> wgpu::Texture {
    device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Float,
        usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    })
}

impl Kernels {
    /// The texture x's rows are copied into for a gemm of `t` rows, where x
    /// can be (CPU adapters; rows of whole 256-byte multiples at a 16-byte
    /// aligned offset, within the adapter's texture size).
    pub(super) fn x_texture(&self, x: Rows, t: u32) -> Option<(wgpu::Texture, wgpu::TextureView)> {
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
            let tex = f32_texture(&self.ctx.device, "gemm x", x.stride / 4, rows);
            let view = tex.create_view(&wgpu::TextureViewDescriptor::default());
            (tex, view)
        });
        Some(tex.clone())
    }

    /// The norm weight `w` (`d` floats) as a one-row texture, made (and
    /// filled, by a copy submitted at once) the first time it is used.
    pub(super) fn norm_texture(&self, w: &wgpu::Buffer, d: u32) -> Result<Bound, GpuError> {
        if u64::from(d) * 4 > w.size() || !d.is_multiple_of(4) {
            return Err(GpuError::Limit(format!(
                "rms_norm weight of {} bytes for rows of {d} floats",
                w.size()
            )));
        }
        let mut cache = self.norm_tex.lock().unwrap_or_else(|e| e.into_inner());
        let view = cache.entry((w.clone(), d)).or_insert_with(|| {
            let tex = f32_texture(&self.ctx.device, "rms_norm weight", d / 4, 1);
            let mut enc = self
                .ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            enc.copy_buffer_to_texture(
                wgpu::TexelCopyBufferInfo {
                    buffer: w,
                    layout: wgpu::TexelCopyBufferLayout::default(),
                },
                tex.as_image_copy(),
                tex.size(),
            );
            self.ctx.queue.submit([enc.finish()]);
            tex.create_view(&wgpu::TextureViewDescriptor::default())
        });
        Ok(Bound::Tex {
            view: view.clone(),
            bytes: u64::from(d) * 4,
        })
    }
}
