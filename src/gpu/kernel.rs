//! A compute pipeline with an explicit bind-group layout: binding 0 is the
//! dispatch's uniform parameters, the rest are storage buffers (or textures)
//! in the order the WGSL declares them.

use super::GpuError;

/// Access of one storage binding (binding 0, the parameters, is implicit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Read = 0,
    ReadWrite = 1,
    /// A `texture_storage_2d_array<rgba32float, write>` written with `textureStore`.
    StoreF32Array = 5,
    /// Textures read with `textureLoad` as read-only storage textures (on
    /// llvmpipe an image load is inline code where a sampled-texture fetch is
    /// a call into a generic function: twice the read rate, see
    /// roofs.rs): `texture_storage_2d<F, read>` with F rgba32uint, rgba32float,
    /// rg32float or r32float, and `texture_storage_2d_array<rgba32float, read>`.
    LoadRgba32Uint = 6,
    LoadRgba32Float = 7,
    LoadRg32Float = 8,
    LoadR32Float = 9,
    LoadRgba32FloatArray = 10,
    /// `texture_storage_2d_array<rg32uint, write>`: a KV cache of halves,
    /// four a texel, packed by the kernels (kv_tex.rs).
    StoreRg32UintArray = 11,
    /// `texture_storage_2d_array<rg32uint, read>`: the same, read.
    LoadRg32UintArray = 12,
}

impl Binding {
    /// The texel format of a storage-texture binding.
    pub fn texture_format(self) -> Option<wgpu::TextureFormat> {
        use wgpu::TextureFormat as F;
        match self {
            Self::LoadRgba32Uint => Some(F::Rgba32Uint),
            Self::LoadRgba32Float | Self::LoadRgba32FloatArray | Self::StoreF32Array => Some(F::Rgba32Float),
            Self::LoadRg32Float => Some(F::Rg32Float),
            Self::LoadR32Float => Some(F::R32Float),
            Self::StoreRg32UintArray | Self::LoadRg32UintArray => Some(F::Rg32Uint),
            Self::Read | Self::ReadWrite => None,
        }
    }

    /// The WGSL spelling of a storage-texture binding's texel format (what
    /// `texture_storage_2d<F, ..>` declares); empty for buffers.
    pub fn wgsl_texel(self) -> &'static str {
        use wgpu::TextureFormat as F;
        match self.texture_format() {
            Some(F::Rgba32Uint) => "rgba32uint",
            Some(F::Rgba32Float) => "rgba32float",
            Some(F::Rg32Float) => "rg32float",
            Some(F::R32Float) => "r32float",
            Some(F::Rg32Uint) => "rg32uint",
            _ => "",
        }
    }
}

/// A compiled compute pipeline and its layout.
#[derive(Debug)]
pub struct Kernel {
    pub name: String,
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub storage: Vec<Binding>,
}

impl Kernel {
    /// Compiles `source` (entry point `main`) with a uniform at binding 0 and
    /// `storage` buffers at bindings 1.. .
    /// `cache`: the device's persisted pipeline cache, if any. Most code asks
    /// the context's `PipelineStore` instead, which compiles each pipeline once.
    pub fn new(
        device: &wgpu::Device,
        name: &str,
        source: &str,
        storage: &[Binding],
        cache: Option<&wgpu::PipelineCache>,
    ) -> Result<Self, GpuError> {
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                // The step's parameters are one buffer; each dispatch picks its slice.
                has_dynamic_offset: true,
                min_binding_size: None,
            },
            count: None,
        }];
        for (i, b) in storage.iter().enumerate() {
            let (d2, d2_array) = (wgpu::TextureViewDimension::D2, wgpu::TextureViewDimension::D2Array);
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match b {
                    Binding::StoreF32Array | Binding::StoreRg32UintArray => wgpu::BindingType::StorageTexture {
                        access: wgpu::StorageTextureAccess::WriteOnly,
                        format: b.texture_format().unwrap_or(wgpu::TextureFormat::Rgba32Float),
                        view_dimension: d2_array,
                    },
                    Binding::LoadRgba32Uint
                    | Binding::LoadRgba32Float
                    | Binding::LoadRg32Float
                    | Binding::LoadR32Float
                    | Binding::LoadRgba32FloatArray
                    | Binding::LoadRg32UintArray => wgpu::BindingType::StorageTexture {
                        access: wgpu::StorageTextureAccess::ReadOnly,
                        format: b.texture_format().unwrap_or(wgpu::TextureFormat::Rgba32Float),
                        view_dimension: if matches!(b, Binding::LoadRgba32FloatArray | Binding::LoadRg32UintArray) {
                            d2_array
                        } else {
                            d2
                        },
                    },
                    _ => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: *b == Binding::Read,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                },
                count: None,
            });
        }
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(name),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache,
        });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Shader {
                name: name.to_string(),
                message: err.to_string(),
            });
        }
        Ok(Self {
            name: name.to_string(),
            pipeline,
            layout,
            storage: storage.to_vec(),
        })
    }
}
