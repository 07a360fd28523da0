//! The wgpu backend: `Kernels` (the WGSL kernels) behind the ops interface. A
//! step is a `StepEncoder`: every op is recorded, `finish` submits once.

use wgpu::util::DeviceExt;

use super::{Backend, PagedKv, RopePairing, Rows, WeightInfo};
use crate::gpu::{BufSlice, GpuError, StepEncoder};
use crate::kernels::{GpuWeight, Kernels};
use crate::quant::{Repacked, WeightFormat};

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

impl Backend for Kernels {
    type Buffer = wgpu::Buffer;
    type Weight = GpuWeight;
    type Step = StepEncoder;

    fn describe(&self) -> String {
        self.ctx.describe()
    }

    fn max_buffer(&self) -> u64 {
        self.ctx.max_binding()
    }

    fn zeros(&self, bytes: u64) -> Result<wgpu::Buffer, GpuError> {
        Ok(self.scratch(bytes))
    }

    fn upload(&self, data: &[u8], label: &str) -> Result<wgpu::Buffer, GpuError> {
        let mut v = data.to_vec();
        v.resize(v.len().max(16).div_ceil(4) * 4, 0);
        Ok(self.ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &v,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        }))
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
        Ok(GpuWeight::upload(&self.ctx, r, label))
    }

    fn prepare_gemm(&self, w: &GpuWeight) -> Result<(), GpuError> {
        Kernels::prepare_gemm(self, w)
    }

    fn prepare_embed(&self, w: &GpuWeight) -> Result<(), GpuError> {
        Kernels::prepare_embed(self, w)
    }

    fn prepare_attention(&self, head_dim: u32, heads: u32, kv_heads: u32) -> Result<(), GpuError> {
        Kernels::prepare_attention(self, head_dim, heads, kv_heads)
    }

    fn begin(&self) -> StepEncoder {
        StepEncoder::with_cache(&self.ctx, self.bind_cache.clone())
    }

    fn finish(&self, step: StepEncoder, reads: &[(&wgpu::Buffer, u64)]) -> Result<Vec<Vec<u8>>, GpuError> {
        let slices: Vec<BufSlice> = reads.iter().map(|&(b, n)| BufSlice::range(b, 0, n)).collect();
        step.submit_and_read(&slices)
    }

    fn gemm(&self, s: &mut StepEncoder, w: &GpuWeight, x: Rows, y: Rows, t: u32) -> Result<(), GpuError> {
        Kernels::gemm(self, s, w, x, y, t)
    }

    fn embed(
        &self,
        s: &mut StepEncoder,
        w: &GpuWeight,
        ids: &wgpu::Buffer,
        t: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        Kernels::embed(self, s, w, ids, t, out)
    }

    fn rms_norm(
        &self,
        s: &mut StepEncoder,
        x: Rows,
        w: &wgpu::Buffer,
        residual: Option<&wgpu::Buffer>,
        rows: Option<&wgpu::Buffer>,
        eps: f32,
        t: u32,
        d: u32,
        y: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        Kernels::rms_norm(self, s, x, w, residual, rows, eps, t, d, y);
        Ok(())
    }

    fn rope(
        &self,
        s: &mut StepEncoder,
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
        Kernels::rope(
            self, s, x, stride, positions, table, max_pos, t, heads, head_dim, pairing,
        );
        Ok(())
    }

    fn silu_mul(
        &self,
        s: &mut StepEncoder,
        gu: &wgpu::Buffer,
        out: &wgpu::Buffer,
        t: u32,
        inter: u32,
    ) -> Result<(), GpuError> {
        Kernels::silu_mul(self, s, gu, out, t, inter);
        Ok(())
    }

    fn cache_write(
        &self,
        s: &mut StepEncoder,
        qkv: Rows,
        k_off: u32,
        v_off: u32,
        kv_width: u32,
        slot_mapping: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        t: u32,
    ) -> Result<(), GpuError> {
        Kernels::cache_write(self, s, qkv, k_off, v_off, kv_width, slot_mapping, k_cache, v_cache, t);
        Ok(())
    }

    fn paged_attention(
        &self,
        s: &mut StepEncoder,
        q: &wgpu::Buffer,
        q_stride: u32,
        kv: PagedKv,
        heads: u32,
        t: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        Kernels::paged_attention(self, s, q, q_stride, kv, heads, t, out)
    }

    fn argmax(
        &self,
        s: &mut StepEncoder,
        x: &wgpu::Buffer,
        n: u32,
        rows: u32,
        out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        Kernels::argmax(self, s, x, n, rows, out);
        Ok(())
    }
}
