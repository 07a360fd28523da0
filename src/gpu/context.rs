//! Opens the device: picks an adapter (discrete > integrated > CPU, Vulkan /
//! Metal / DX12 first), requests the adapter's own limits and the optional
//! features it offers, and never requires one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use super::PipelineStore;
pub use crate::config::PipelineCacheDir;

/// Errors from opening or using the GPU.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no GPU adapter found (wgpu saw: {seen}). Install a Vulkan driver; on Linux without a GPU \
         the software one works: `apt-get update && apt-get install -y mesa-vulkan-drivers`"
    )]
    NoAdapter { seen: String },
    #[error("no adapter matches {wanted:?}; available adapters: {seen}")]
    AdapterNotFound { wanted: String, seen: String },
    #[error("could not open a device on {adapter}: {source}")]
    RequestDevice {
        adapter: String,
        source: wgpu::RequestDeviceError,
    },
    #[error("GPU readback failed: {0}")]
    Readback(String),
    #[error("shader {name} failed to compile: {message}")]
    Shader { name: String, message: String },
    #[error("{0}")]
    Limit(String),
    #[error(
        "the GPU ran out of memory ({0}): free memory on it (other programs hold some), or start with a \
         smaller --kv-cache-memory or --gpu-memory-utilization, fewer --max-num-seqs, or a smaller quantisation"
    )]
    OutOfMemory(String),
    #[error("the GPU reported an error: {0}")]
    Device(String),
}

impl PipelineCacheDir {
    pub fn resolve(&self) -> Option<PathBuf> {
        match self {
            Self::User => super::user_cache_dir(),
            Self::At(p) => Some(p.clone()),
            Self::Off => None,
        }
    }
}

/// How to choose the adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuOptions {
    /// Case-insensitive substring of the adapter name; `None`: the best adapter.
    pub adapter: Option<String>,
    pub pipeline_cache: PipelineCacheDir,
    /// Fail resource creation beyond this percent of the memory budget the
    /// driver reports (wgpu's `MemoryBudgetThresholds`; Vulkan), as an
    /// out-of-memory error; `None`: as the driver fails it.
    pub memory_budget_threshold: Option<u8>,
}

/// The opened device with what we learnt about it. Cheap to clone.
#[derive(Clone)]
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: Arc<wgpu::AdapterInfo>,
    pub limits: Arc<wgpu::Limits>,
    pub features: wgpu::Features,
    /// Whether every texel format the CPU-adapter kernels read (rgba32uint,
    /// rgba32float, rg32float, r32float) can be bound as a read-only storage
    /// texture, as those kernels bind them.
    pub storage_read_textures: bool,
    /// Whether rg32uint array textures can be read and written as storage
    /// textures (a KV cache of packed halves held as textures on CPU adapters).
    pub f16_storage_textures: bool,
    /// The adapter's memory, where its driver reports it (read at open).
    pub memory: Option<super::DeviceMemory>,
    cache_dir: Option<PathBuf>,
    pipelines: Arc<OnceLock<Arc<PipelineStore>>>,
    /// The first error the device raised outside an error scope (wgpu's
    /// default handler would panic): out of memory, or another; taken by the
    /// next step's readback or the engine's load, which fail with it.
    errors: Arc<Mutex<Option<(bool, String)>>>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext({})", self.describe())
    }
}

fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    }
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn describe_info(i: &wgpu::AdapterInfo) -> String {
    format!(
        "{} ({:?}, {:?}, driver {} {})",
        i.name, i.backend, i.device_type, i.driver, i.driver_info
    )
}

impl GpuContext {
    /// Opens the best adapter, or the one `opts.adapter` names.
    pub fn new(opts: &GpuOptions) -> Result<Self, GpuError> {
        pollster::block_on(Self::new_async(opts))
    }

    /// As `new`, but one device per set of options in this process: engines
    /// opened with the same options share the device and its compiled pipelines.
    pub fn shared(opts: &GpuOptions) -> Result<Self, GpuError> {
        static OPEN: Mutex<Vec<(GpuOptions, GpuContext)>> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, ctx)) = open.iter().find(|(o, _)| o == opts) {
            return Ok(ctx.clone());
        }
        let ctx = Self::new(opts)?;
        open.push((opts.clone(), ctx.clone()));
        Ok(ctx)
    }

    /// The device's pipeline store, opened by the first caller with the shader
    /// sources that key its persisted cache (the wgpu backend's templates).
    pub fn pipelines(&self, shader_sources: &[&str]) -> Arc<PipelineStore> {
        self.pipelines
            .get_or_init(|| {
                Arc::new(PipelineStore::open(
                    &self.device,
                    &self.info,
                    self.cache_dir.as_deref(),
                    shader_sources,
                ))
            })
            .clone()
    }

    async fn new_async(opts: &GpuOptions) -> Result<Self, GpuError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::all();
        desc.memory_budget_thresholds.for_resource_creation = opts.memory_budget_threshold;
        let instance = wgpu::Instance::new(desc);
        let mut adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let seen = adapters
            .iter()
            .map(|a| describe_info(&a.get_info()))
            .collect::<Vec<_>>()
            .join("; ");
        if adapters.is_empty() {
            return Err(GpuError::NoAdapter { seen: "none".into() });
        }
        let wanted = opts.adapter.clone().filter(|s| !s.is_empty());
        if let Some(w) = &wanted {
            let w = w.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&w));
            if adapters.is_empty() {
                return Err(GpuError::AdapterNotFound { wanted: w, seen });
            }
        }
        adapters.sort_by_key(|a| {
            let i = a.get_info();
            (type_rank(i.device_type), backend_rank(i.backend))
        });
        let adapter = adapters.remove(0);
        let info = adapter.get_info();
        let optional = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::PIPELINE_CACHE;
        let features = adapter.features() & optional;
        let limits = adapter.limits();
        let storage_read_textures = [
            wgpu::TextureFormat::Rgba32Uint,
            wgpu::TextureFormat::Rgba32Float,
            wgpu::TextureFormat::Rg32Float,
            wgpu::TextureFormat::R32Float,
        ]
        .into_iter()
        .all(|f| {
            adapter
                .get_texture_format_features(f)
                .flags
                .contains(wgpu::TextureFormatFeatureFlags::STORAGE_READ_ONLY)
        });
        let f16_storage_textures = adapter
            .get_texture_format_features(wgpu::TextureFormat::Rg32Uint)
            .flags
            .contains(
                wgpu::TextureFormatFeatureFlags::STORAGE_READ_ONLY
                    | wgpu::TextureFormatFeatureFlags::STORAGE_WRITE_ONLY,
            );
        let memory = super::memory::query(&adapter);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wllm"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|source| GpuError::RequestDevice {
                adapter: describe_info(&info),
                source,
            })?;
        let errors: Arc<Mutex<Option<(bool, String)>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let oom = matches!(e, wgpu::Error::OutOfMemory { .. });
            let mut first = sink.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = Some((oom, e.to_string()));
            }
        }));
        Ok(Self {
            errors,
            device,
            queue,
            info: Arc::new(info),
            limits: Arc::new(limits),
            features,
            storage_read_textures,
            f16_storage_textures,
            memory,
            cache_dir: opts.pipeline_cache.resolve().map(|d| d.join("pipelines")),
            pipelines: Arc::default(),
        })
    }

    /// The first error the device raised since the last call, if any
    /// (out of memory: `GpuError::OutOfMemory`).
    pub fn take_error(&self) -> Option<GpuError> {
        let taken = self.errors.lock().unwrap_or_else(|p| p.into_inner()).take();
        taken.map(|(oom, msg)| {
            if oom {
                GpuError::OutOfMemory(msg)
            } else {
                GpuError::Device(msg)
            }
        })
    }

    /// Bytes of device memory bound to this device's live buffers and
    /// textures now (wgpu-hal's counters), after flushing the queue's
    /// pending uploads (their staging buffers live until a submission
    /// completes) and polling the device (resources dropped are counted out
    /// then).
    pub fn device_bytes(&self) -> u64 {
        self.queue.submit(std::iter::empty());
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        let c = self.device.get_internal_counters();
        (c.hal.buffer_memory.read() + c.hal.texture_memory.read()).max(0) as u64
    }

    /// One line naming the adapter, backend and driver.
    pub fn describe(&self) -> String {
        describe_info(&self.info)
    }

    /// True for software adapters such as lavapipe, which favour other shapes.
    pub fn is_cpu(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Whether weights, activations and the KV cache are held as textures
    /// for the CPU kernel shapes: a software adapter that can bind them as
    /// read-only storage textures.
    pub fn cpu_textures(&self) -> bool {
        self.is_cpu() && self.storage_read_textures
    }

    /// A storage buffer holding `bytes`, zero-padded to the non-empty, 4-byte-multiple
    /// size wgpu needs.
    pub fn storage_buffer(&self, bytes: &[u8], label: &str) -> wgpu::Buffer {
        use wgpu::util::DeviceExt;
        let mut v = bytes.to_vec();
        v.resize(v.len().max(16).div_ceil(4) * 4, 0);
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &v,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        })
    }

    /// Largest byte range one storage binding may cover.
    pub fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }
}
