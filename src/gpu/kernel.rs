//! A compute pipeline with an explicit bind-group layout: binding 0 is the
//! dispatch's uniform parameters, the rest are storage buffers (or textures)
//! in the order the WGSL declares them.

use super::GpuError;

/// Access of one storage binding (binding 0, the parameters, is implicit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Read = 0,
    ReadWrite = 1,
    /// A `texture_2d<u32>` read with `textureLoad`.
    TexU32 = 2,
    /// A `texture_2d<f32>` (unfilterable) read with `textureLoad`.
    TexF32 = 3,
    /// A `texture_2d_array<f32>` (unfilterable) read with `textureLoad`.
    TexF32Array = 4,
    /// A `texture_storage_2d_array<rgba32float, write>` written with `textureStore`.
    StoreF32Array = 5,
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
            let texture = |sample_type, view_dimension| wgpu::BindingType::Texture {
                sample_type,
                view_dimension,
                multisampled: false,
            };
            let (d2, d2_array) = (wgpu::TextureViewDimension::D2, wgpu::TextureViewDimension::D2Array);
            let unfiltered = wgpu::TextureSampleType::Float { filterable: false };
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match b {
                    Binding::TexU32 => texture(wgpu::TextureSampleType::Uint, d2),
                    Binding::TexF32 => texture(unfiltered, d2),
                    Binding::TexF32Array => texture(unfiltered, d2_array),
                    Binding::StoreF32Array => wgpu::BindingType::StorageTexture {
                        access: wgpu::StorageTextureAccess::WriteOnly,
                        format: wgpu::TextureFormat::Rgba32Float,
                        view_dimension: d2_array,
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
