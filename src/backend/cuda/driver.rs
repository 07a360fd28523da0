//! The NVIDIA device as an `Executor`: cudarc's driver API on the context's
//! default stream, the NVRTC-compiled program, and cuBLAS on the same stream.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use super::CudaError;
use super::exec::{Arg, DeviceMem, Executor};
use super::program;

pub(super) fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver(format!("{what}: {e}"))
}

/// One NVIDIA device.
pub struct DriverExecutor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    funcs: HashMap<String, CudaFunction>,
    name: String,
    capability: (i32, i32),
    total_mem: u64,
}

impl DriverExecutor {
    /// Opens device `ordinal`, compiles the kernels with NVRTC and loads them.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("opening the device"))?;
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(cuda_err("device name"))?;
        let capability = ctx.compute_capability().map_err(cuda_err("compute capability"))?;
        let total_mem = ctx.total_mem().map_err(cuda_err("device memory"))? as u64;
        let ptx = program::compile(capability.0, capability.1).map_err(CudaError::Driver)?;
        let module = ctx.load_module(ptx).map_err(cuda_err("loading the compiled kernels"))?;
        let mut funcs = HashMap::new();
        for f in program::entry_points() {
            let func = module.load_function(&f).map_err(cuda_err(&f))?;
            funcs.insert(f, func);
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Driver(format!("starting cuBLAS: {e}")))?;
        Ok(Self {
            ctx,
            stream,
            blas,
            funcs,
            name,
            capability,
            total_mem,
        })
    }

    /// Makes the context current on the calling thread (the engine runs on its
    /// own thread; raw driver and cuBLAS calls need it).
    fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(cuda_err("binding the context"))
    }
}

impl Executor for DriverExecutor {
    fn describe(&self) -> String {
        format!(
            "{} (CUDA, compute capability {}.{}, {:.1} GiB)",
            self.name,
            self.capability.0,
            self.capability.1,
            self.total_mem as f64 / (1u64 << 30) as f64
        )
    }

    fn total_mem(&self) -> u64 {
        self.total_mem
    }

    fn free_mem(&self) -> Option<u64> {
        self.bind().ok()?;
        self.ctx.mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn alloc(&self, bytes: u64) -> Result<DeviceMem, CudaError> {
        let mem = self
            .stream
            .alloc_zeros::<u8>(bytes as usize)
            .map_err(cuda_err("allocating device memory"))?;
        let ptr = {
            let (ptr, _sync) = mem.device_ptr(&self.stream);
            ptr
        };
        Ok(DeviceMem {
            ptr,
            bytes,
            owner: Box::new(mem),
        })
    }

    fn write(&self, dst: u64, data: &[u8]) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the caller guarantees `dst` addresses at least `data.len()` bytes of
        // live device memory; the copy is ordered on the stream before later
        // launches, and a copy from pageable memory is staged when the call returns.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }
            .map_err(cuda_err("copying to the device"))
    }

    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the caller guarantees `src` addresses at least `out.len()` bytes of
        // live device memory; the copy follows every launch on the stream and is
        // complete when the call returns (pageable destination).
        unsafe { cudarc::driver::result::memcpy_dtoh_async(out, src, self.stream.cu_stream()) }
            .map_err(cuda_err("reading back"))
    }

    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<(), CudaError> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::Driver(format!("kernel {name} is missing from the program")))?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every kernel of shaders/cuda takes exactly the arguments the op
        // layer (ops.rs, gemm.rs) passes, in order and type (checked on the CPU
        // emulation in the tests), and bounds every access by those counts; each
        // address is a live allocation that the caller keeps alive until the step's
        // `synchronize`.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    fn sgemm_tn(
        &self,
        m: u32,
        n: u32,
        k: u32,
        a: u64,
        lda: u32,
        b: u64,
        ldb: u32,
        c: u64,
        ldc: u32,
    ) -> Result<(), CudaError> {
        self.bind()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller guarantees a, b, c address live f32 matrices of the
        // stated shapes and leading dimensions; cuBLAS runs on this stream, in order
        // with the kernels; alpha and beta are host scalars (the default pointer mode).
        unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                &alpha,
                a as *const f32,
                lda as i32,
                b as *const f32,
                ldb as i32,
                &beta,
                c as *mut f32,
                ldc as i32,
            )
        }
        .map_err(|e| CudaError::Driver(format!("cuBLAS sgemm: {e}")))
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(cuda_err("running the step"))
    }
}
