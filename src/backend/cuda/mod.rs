//! The cuda backend (`--features cuda`): the ops interface on an NVIDIA device
//! through the driver API, loaded at run time (cudarc, dynamic loading: no CUDA
//! toolkit is needed to build). Kernels are the CUDA C files of shaders/cuda/,
//! compiled by NVRTC at start-up (`program`); prefill GEMMs go to cuBLAS
//! (`gemm`). Everything runs in order on one stream: a step is the launches
//! made between `begin` and `finish`, which copies the reads back and waits.

mod gemm;
mod ops;
pub mod program;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};

use super::WeightInfo;
use crate::gpu::GpuError;
use crate::quant::WeightFormat;

/// Why the cuda backend cannot run on this machine, or `None` when it can.
pub fn unavailable() -> Option<String> {
    // SAFETY: these only probe whether the shared libraries can be opened.
    let (driver, nvrtc, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Some("no NVIDIA driver (libcuda) on this machine".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return Some("the NVIDIA driver reports no CUDA device".into()),
        Err(e) => return Some(format!("the NVIDIA driver did not answer: {e}")),
    }
    if !nvrtc {
        return Some(program::NVRTC_MISSING.into());
    }
    if !blas {
        return Some(
            "libcublas was not found: install the CUDA toolkit, or `pip install nvidia-cublas-cu12` and add its \
             lib directory to LD_LIBRARY_PATH"
                .into(),
        );
    }
    None
}

fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> GpuError + '_ {
    move |e| GpuError::Cuda(format!("{what}: {e}"))
}

/// Device memory and its raw address (kernels take addresses as arguments).
pub struct CudaBuffer {
    mem: CudaSlice<u8>,
    ptr: u64,
}

impl CudaBuffer {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> u64 {
        self.mem.len() as u64
    }
    pub fn is_empty(&self) -> bool {
        self.mem.len() == 0
    }
}

/// A weight in the `quant::repack` layout on the device.
pub struct CudaWeight {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    /// Padded row length of float formats (elements).
    pub kp: usize,
    pub data: CudaBuffer,
    pub scales: Option<CudaBuffer>,
}

impl WeightInfo for CudaWeight {
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
        self.data.len() + self.scales.as_ref().map_or(0, |s| s.len())
    }
}

/// A step being recorded: launches go to the stream as they are made.
pub struct CudaStep {
    _private: (),
}

/// The cuda backend on one device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    funcs: HashMap<String, CudaFunction>,
    name: String,
    capability: (i32, i32),
    total_mem: u64,
    /// f32 copy of a non-f32 weight for the cuBLAS path (grown to the largest weight).
    dequant: Mutex<Option<CudaBuffer>>,
    /// Row count from which gemm uses cuBLAS (`WLLM_CUBLAS_MIN_T`, default 32).
    pub cublas_min_t: u32,
}

impl CudaBackend {
    /// Opens device `ordinal`, compiles the kernels with NVRTC and loads them.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        if let Some(why) = unavailable() {
            return Err(GpuError::Cuda(why));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("opening the device"))?;
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(cuda_err("device name"))?;
        let capability = ctx.compute_capability().map_err(cuda_err("compute capability"))?;
        let total_mem = ctx.total_mem().map_err(cuda_err("device memory"))? as u64;
        let ptx = program::compile(capability.0, capability.1).map_err(GpuError::Cuda)?;
        let module = ctx.load_module(ptx).map_err(cuda_err("loading the compiled kernels"))?;
        let mut funcs = HashMap::new();
        for f in program::entry_points() {
            let func = module.load_function(&f).map_err(cuda_err(&f))?;
            funcs.insert(f, func);
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| GpuError::Cuda(format!("starting cuBLAS: {e}")))?;
        let cublas_min_t = std::env::var("WLLM_CUBLAS_MIN_T")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(32);
        Ok(Self {
            ctx,
            stream,
            blas,
            funcs,
            name,
            capability,
            total_mem,
            dequant: Mutex::new(None),
            cublas_min_t,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "{} (CUDA, compute capability {}.{}, {:.1} GiB)",
            self.name,
            self.capability.0,
            self.capability.1,
            self.total_mem as f64 / (1u64 << 30) as f64
        )
    }

    /// Makes the device's context current on the calling thread (the engine runs
    /// on its own thread; raw driver and cuBLAS calls need it).
    pub(super) fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(cuda_err("binding the context"))
    }

    fn func(&self, name: &str) -> Result<&CudaFunction, GpuError> {
        self.funcs
            .get(name)
            .ok_or_else(|| GpuError::Cuda(format!("kernel {name} is missing from the program")))
    }

    fn alloc(&self, bytes: u64) -> Result<CudaBuffer, GpuError> {
        let bytes = bytes.max(16).div_ceil(16) * 16;
        let mem = self
            .stream
            .alloc_zeros::<u8>(bytes as usize)
            .map_err(cuda_err("allocating device memory"))?;
        Ok(self.wrap(mem))
    }

    fn wrap(&self, mem: CudaSlice<u8>) -> CudaBuffer {
        let ptr = {
            let (ptr, _sync) = mem.device_ptr(&self.stream);
            ptr
        };
        CudaBuffer { mem, ptr }
    }

    fn upload_bytes(&self, data: &[u8]) -> Result<CudaBuffer, GpuError> {
        let mut v = data.to_vec();
        v.resize(v.len().max(16).div_ceil(16) * 16, 0);
        let mem = self.stream.clone_htod(&v).map_err(cuda_err("uploading"))?;
        Ok(self.wrap(mem))
    }

    /// Copies the first `bytes` of `b` to the host, in stream order.
    fn read(&self, b: &CudaBuffer, bytes: u64) -> Result<Vec<u8>, GpuError> {
        if bytes > b.len() {
            return Err(GpuError::Readback(format!(
                "read of {bytes} bytes from a buffer of {}",
                b.len()
            )));
        }
        let mut out = vec![0u8; bytes as usize];
        if bytes > 0 {
            self.bind()?;
            // SAFETY: `b.ptr` addresses `b.len() >= bytes` bytes owned by `b`, which
            // outlives the call; the copy is ordered after every launch on the stream
            // and is complete when the call returns (pageable destination).
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, b.ptr, self.stream.cu_stream()) }
                .map_err(cuda_err("reading back"))?;
        }
        Ok(out)
    }
}
