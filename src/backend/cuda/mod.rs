//! The cuda backend (`--features cuda`): the ops interface on an NVIDIA device
//! through the driver API, loaded at run time (cudarc, dynamic loading: no CUDA
//! toolkit is needed to build). Kernels are the CUDA C files of shaders/cuda/,
//! compiled by NVRTC at start-up (`program`); prefill GEMMs go to cuBLAS
//! (`gemm`). Everything runs in order on one stream: a step is the launches
//! made between `begin` and `finish`, which copies the reads back and waits.
//! The op layer talks to an `Executor` (`driver` on a device; the tests run the
//! same layer and kernels on a CPU emulation).

pub mod driver;
mod error;
pub mod exec;
mod gemm;
mod ops;
pub mod program;

use std::sync::Mutex;

pub use exec::{Arg, DeviceMem, Executor};

use super::WeightInfo;
use crate::quant::WeightFormat;
pub use error::CudaError;

/// Why the cuda backend cannot run on this machine, or `None` when it can.
pub fn unavailable() -> Option<String> {
    // SAFETY: these only probe whether the shared libraries can be opened.
    let (driver, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Some("no NVIDIA driver (libcuda) on this machine".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return Some("the NVIDIA driver reports no CUDA device".into()),
        Err(e) => return Some(format!("the NVIDIA driver did not answer: {e}")),
    }
    if !program::nvrtc_present() {
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

/// Device memory (f32 or u32 elements) of the cuda backend.
pub struct CudaBuffer {
    mem: DeviceMem,
}

impl CudaBuffer {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.mem.ptr
    }
    pub fn len(&self) -> u64 {
        self.mem.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.mem.bytes == 0
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

/// The cuda backend.
pub struct CudaBackend {
    exec: std::sync::Arc<dyn Executor>,
    /// f32 copy of a non-f32 weight for the cuBLAS path (grown to the largest weight).
    dequant: Mutex<Option<CudaBuffer>>,
    /// Row count from which gemm uses cuBLAS (`EngineConfig::cublas_min_t`, default 32; 0 = never).
    pub cublas_min_t: u32,
}

/// The default of `cublas_min_t`.
pub const DEFAULT_CUBLAS_MIN_T: u32 = 32;

impl CudaBackend {
    /// Opens NVIDIA device `ordinal`, compiling the kernels with NVRTC.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        if let Some(why) = unavailable() {
            return Err(CudaError::Driver(why));
        }
        Ok(Self::with_executor(Box::new(driver::DriverExecutor::new(ordinal)?)))
    }

    /// The backend on any executor (the tests use a CPU emulation).
    pub fn with_executor(exec: Box<dyn Executor>) -> Self {
        Self {
            exec: exec.into(),
            dequant: Mutex::new(None),
            cublas_min_t: DEFAULT_CUBLAS_MIN_T,
        }
    }

    pub fn describe(&self) -> String {
        self.exec.describe()
    }

    /// Another backend on the same executor (device and stream), with its own dequantisation scratch.
    pub fn sibling(&self) -> Self {
        Self {
            exec: self.exec.clone(),
            dequant: Mutex::new(None),
            cublas_min_t: self.cublas_min_t,
        }
    }

    fn alloc(&self, bytes: u64) -> Result<CudaBuffer, CudaError> {
        let bytes = bytes.max(16).div_ceil(16) * 16;
        Ok(CudaBuffer {
            mem: self.exec.alloc(bytes)?,
        })
    }

    fn upload_bytes(&self, data: &[u8]) -> Result<CudaBuffer, CudaError> {
        let b = self.alloc(data.len() as u64)?;
        if !data.is_empty() {
            self.exec.write(b.ptr(), data)?;
        }
        Ok(b)
    }

    /// Copies the first `bytes` of `b` to the host, in stream order.
    fn read(&self, b: &CudaBuffer, bytes: u64) -> Result<Vec<u8>, CudaError> {
        if bytes > b.len() {
            return Err(CudaError::Readback(format!(
                "read of {bytes} bytes from a buffer of {}",
                b.len()
            )));
        }
        let mut out = vec![0u8; bytes as usize];
        if bytes > 0 {
            self.exec.read(b.ptr(), &mut out)?;
        }
        Ok(out)
    }
}
