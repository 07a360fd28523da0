//! The paged KV cache as textures, on CPU adapters (lavapipe).
//!
//! llvmpipe loads a storage-buffer element lane by lane (a loop with a bounds
//! check per component), but loads a texel for all eight lanes at once (the
//! textures bound as read-only storage textures: an inline image load). Paged
//! attention reads every K and V row of every key, so there the cache's layout
//! decides the speed: `Backend::kv_cache` on a CPU adapter returns a small
//! placeholder buffer that stands for a pair of textures here, and every op
//! that takes the cache (the rope epilogue of the qkv gemm, `cache_write`,
//! `rope_cache_write`, `paged_attention`) writes or reads the texture instead.
//!
//! Layout: an rgba32float (f32 cache) or rg32uint (f16 cache: four halves a
//! texel, packed by the kernels as in a buffer, half_pack.wgsl, so textures
//! and buffers hold the same bits; a float16 texture format would leave the
//! rounding to the driver, which lavapipe does not round to nearest) 2D array
//! texture; slot s (block · block_size + offset) is texel row
//! `s % SLOTS_PER_LAYER` of layer `s / SLOTS_PER_LAYER`, its `width / 4`
//! texels the K (or V) row of that token (kv_heads · head_dim values).
//! Where the adapter cannot bind rg32uint storage textures an f16 cache is a
//! buffer of packed halves instead; a q8_0 cache is always a buffer. Ops bind a view of only the layers that hold the step's `kv_rows`
//! (as buffers bind only the used prefix), so wgpu zero-fills, and the driver
//! touches, only the part of the pool in use.

use std::collections::HashMap;

use crate::backend::KvDtype;
use crate::gpu::{Binding, Bound, BufSlice, GpuError, StepEncoder};

/// Token slots in one layer of a KV texture (a multiple of every block size).
pub const SLOTS_PER_LAYER: u32 = 1024;

/// One KV texture (K or V of one model layer) and the views made of it so far.
pub(crate) struct KvTexture {
    tex: wgpu::Texture,
    /// Values per slot (kv_heads · head_dim).
    width: u32,
    dtype: KvDtype,
    /// Views of the first n layers, by n.
    views: HashMap<u32, wgpu::TextureView>,
}

impl KvTexture {
    /// Whether a pool of `rows` slots of `width` floats can be a texture on a
    /// device with `limits` (rows of whole texels, within the texture limits).
    pub fn fits(limits: &wgpu::Limits, rows: u64, width: u32) -> bool {
        let layers = rows.div_ceil(u64::from(SLOTS_PER_LAYER));
        width.is_multiple_of(8)
            && width / 4 <= limits.max_texture_dimension_2d
            && SLOTS_PER_LAYER <= limits.max_texture_dimension_2d
            && layers <= u64::from(limits.max_texture_array_layers)
    }

    pub fn new(device: &wgpu::Device, rows: u64, width: u32, dtype: KvDtype) -> Self {
        let layers = rows.div_ceil(u64::from(SLOTS_PER_LAYER)).max(1) as u32;
        let tex = device.create_texture(&wgpu::TextureDescriptor {
            label: Some("kv cache"),
            size: wgpu::Extent3d {
                width: width / 4,
                height: SLOTS_PER_LAYER,
                depth_or_array_layers: layers,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: texel_format(dtype),
            usage: wgpu::TextureUsages::TEXTURE_BINDING
                | wgpu::TextureUsages::STORAGE_BINDING
                | wgpu::TextureUsages::COPY_SRC,
            view_formats: &[],
        });
        Self {
            tex,
            width,
            dtype,
            views: HashMap::new(),
        }
    }

    /// A view of the layers that hold slots 0..rows, bound as a texture.
    pub fn bound(&mut self, rows: u32) -> Bound {
        let all = self.tex.depth_or_array_layers();
        let layers = rows.div_ceil(SLOTS_PER_LAYER).clamp(1, all);
        let tex = &self.tex;
        let view = self.views.entry(layers).or_insert_with(|| {
            tex.create_view(&wgpu::TextureViewDescriptor {
                label: Some("kv cache layers"),
                dimension: Some(wgpu::TextureViewDimension::D2Array),
                base_array_layer: 0,
                array_layer_count: Some(layers),
                ..Default::default()
            })
        });
        Bound::Tex {
            view: view.clone(),
            bytes: u64::from(layers) * u64::from(SLOTS_PER_LAYER) * self.dtype.row_bytes(u64::from(self.width)),
        }
    }
}

/// The texel format of a KV texture of `dtype`.
fn texel_format(dtype: KvDtype) -> wgpu::TextureFormat {
    match dtype {
        KvDtype::F32 => wgpu::TextureFormat::Rgba32Float,
        // (q8_0 caches are buffers: never a texture, see `new_kv_cache`.)
        KvDtype::F16 | KvDtype::Q8_0 => wgpu::TextureFormat::Rg32Uint,
    }
}

/// The bindings of a KV texture of `dtype`, written and read.
pub(crate) fn store_binding(dtype: KvDtype) -> Binding {
    match dtype {
        KvDtype::F32 => Binding::StoreF32Array,
        KvDtype::F16 | KvDtype::Q8_0 => Binding::StoreRg32UintArray,
    }
}

pub(crate) fn load_binding(dtype: KvDtype) -> Binding {
    match dtype {
        KvDtype::F32 => Binding::LoadRgba32FloatArray,
        KvDtype::F16 | KvDtype::Q8_0 => Binding::LoadRg32UintArray,
    }
}

/// The WGSL texel format of a KV texture of `dtype`.
pub(crate) fn wgsl_texel(dtype: KvDtype) -> &'static str {
    load_binding(dtype).wgsl_texel()
}

impl super::Kernels {
    /// A K or V cache of `rows` slots of `width` values of `dtype`: on CPU
    /// adapters, where it fits, a 16-byte placeholder buffer standing for a
    /// texture (see the module's doc); else a zeroed buffer (f16: packed halves).
    pub(crate) fn new_kv_cache(&self, rows: u64, width: u32, dtype: KvDtype) -> wgpu::Buffer {
        // q8_0 rows (int8 values, then a scale per 32) stay buffers.
        let tex_ok = dtype == KvDtype::F32 || (dtype == KvDtype::F16 && self.ctx.f16_storage_textures);
        if self.cpu_shapes && tex_ok && KvTexture::fits(&self.ctx.limits, rows, width) {
            let handle = self.scratch(16);
            let tex = KvTexture::new(&self.ctx.device, rows, width, dtype);
            self.kv_tex
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(handle.clone(), tex);
            return handle;
        }
        self.scratch(rows * dtype.row_bytes(u64::from(width)))
    }

    /// The K and V textures (views of the layers holding slots 0..rows) where
    /// `k` and `v` stand for textures of `dtype`; `None` where both are buffers.
    pub(crate) fn kv_textures(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        rows: u32,
        dtype: KvDtype,
    ) -> Result<Option<[Bound; 2]>, GpuError> {
        let mut map = self.kv_tex.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = map.get(k).filter(|t| t.dtype != dtype) {
            return Err(GpuError::Limit(format!(
                "a KV cache of {} used as one of {dtype}: pass Backend::kv_cache's dtype to the cache ops",
                t.dtype
            )));
        }
        let kb = map.get_mut(k).map(|t| t.bound(rows));
        let vb = map.get_mut(v).map(|t| t.bound(rows));
        match (kb, vb) {
            (None, None) => Ok(None),
            (Some(kb), Some(vb)) => Ok(Some([kb, vb])),
            _ => Err(GpuError::Limit(
                "the K and V caches must both come from Backend::kv_cache (one is a texture, the other a buffer)"
                    .into(),
            )),
        }
    }

    /// The first `rows` slots of a K or V cache made by `kv_cache` (`width`
    /// values of `dtype` each), read back as floats: for tests and
    /// inspection, not for steps.
    pub fn read_kv_cache(
        &self,
        cache: &wgpu::Buffer,
        rows: u32,
        width: u32,
        dtype: KvDtype,
    ) -> Result<Vec<f32>, GpuError> {
        let row_bytes = dtype.row_bytes(u64::from(width));
        let copied = {
            let map = self.kv_tex.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(cache) {
                None => None,
                Some(t) => {
                    // Texel rows padded to the copy alignment, a layer at a time.
                    let layers = rows.div_ceil(SLOTS_PER_LAYER).clamp(1, t.tex.depth_or_array_layers());
                    let padded = row_bytes.next_multiple_of(u64::from(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT));
                    let tmp = self.scratch(padded * u64::from(SLOTS_PER_LAYER * layers));
                    let device = &self.ctx.device;
                    let mut enc =
                        device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv read") });
                    enc.copy_texture_to_buffer(
                        t.tex.as_image_copy(),
                        wgpu::TexelCopyBufferInfo {
                            buffer: &tmp,
                            layout: wgpu::TexelCopyBufferLayout {
                                offset: 0,
                                bytes_per_row: Some(padded as u32),
                                rows_per_image: Some(SLOTS_PER_LAYER),
                            },
                        },
                        wgpu::Extent3d {
                            width: t.width / 4,
                            height: SLOTS_PER_LAYER,
                            depth_or_array_layers: layers,
                        },
                    );
                    self.ctx.queue.submit([enc.finish()]);
                    Some((tmp, padded))
                }
            }
        };
        let (src, stride) = copied.unwrap_or_else(|| (cache.clone(), row_bytes));
        let bytes = StepEncoder::new(&self.ctx)
            .submit_and_read(&[BufSlice::whole(&src)])?
            .remove(0);
        let mut out = Vec::with_capacity(rows as usize * width as usize);
        for r in 0..u64::from(rows) {
            let at = (r * stride) as usize;
            let row = bytes.get(at..at + row_bytes as usize).ok_or_else(|| {
                GpuError::Limit(format!("read_kv_cache: {rows} rows of {width} floats exceed the cache"))
            })?;
            match dtype {
                KvDtype::F32 => out.extend(
                    row.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                ),
                KvDtype::F16 => out.extend(
                    row.chunks_exact(2)
                        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
                ),
                KvDtype::Q8_0 => {
                    let (q, d) = row.split_at(width as usize);
                    out.extend(q.iter().enumerate().map(|(i, &b)| {
                        let s = &d[i / 32 * 4..i / 32 * 4 + 4];
                        f32::from(b as i8) * f32::from_le_bytes([s[0], s[1], s[2], s[3]])
                    }));
                }
            }
        }
        Ok(out)
    }
}

/// The first `rows` rows of a KV cache buffer (all of it if that is less):
/// binding only the pool's used prefix means wgpu zero-fills, and the driver
/// touches, only that much of a large pool.
pub(crate) fn kv_prefix(buf: &wgpu::Buffer, rows: u32, row_bytes: u64) -> BufSlice {
    let bytes = (u64::from(rows) * row_bytes).clamp(4, buf.size());
    BufSlice::range(buf, 0, bytes)
}

/// The K and V caches' used prefixes (`kv_prefix` of both, rows of kv_heads · head_dim values).
pub(crate) fn kv_caches(kv: &super::PagedKv) -> [BufSlice; 2] {
    let row_bytes = kv.dtype.row_bytes(u64::from(kv.kv_heads * kv.head_dim));
    [kv.k_cache, kv.v_cache].map(|c| kv_prefix(c, kv.kv_rows, row_bytes))
}
