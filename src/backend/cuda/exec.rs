//! Where the cuda backend's work runs: the `Executor` owns device memory,
//! copies, kernel launches by entry-point name, and SGEMM. `DriverExecutor`
//! (driver.rs) is the NVIDIA device; the tests also run the very same op layer
//! and CUDA C on a CPU emulation of the CUDA execution model.

use super::CudaError;

/// A kernel argument: a device address, a u32 or an f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(u64),
    U32(u32),
    F32(f32),
}

/// Device memory kept alive by its owner; kernels see it at `ptr`.
pub struct DeviceMem {
    pub ptr: u64,
    pub bytes: u64,
    pub owner: Box<dyn std::any::Any + Send + Sync>,
}

/// The device side of the cuda backend. All work is ordered: a launch sees every
/// earlier write, copy and launch.
pub trait Executor: Send + Sync + 'static {
    /// The device, in words.
    fn describe(&self) -> String;
    /// Bytes of device memory.
    fn total_mem(&self) -> u64;
    /// Bytes of device memory free now, where the driver says.
    fn free_mem(&self) -> Option<u64> {
        None
    }
    /// `bytes` of zeroed device memory (address aligned to 256).
    fn alloc(&self, bytes: u64) -> Result<DeviceMem, CudaError>;
    /// Copies `data` to device address `dst` (valid for `data.len()` bytes).
    fn write(&self, dst: u64, data: &[u8]) -> Result<(), CudaError>;
    /// Copies `out.len()` bytes from device address `src` after all earlier work.
    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), CudaError>;
    /// Launches entry point `name` with `block` threads per block.
    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<(), CudaError>;
    /// Column-major C (m x n, ldc) = Aᵀ · B, A (k x m, lda), B (k x n, ldb), all f32.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), CudaError>;
    /// Waits for all work.
    fn synchronize(&self) -> Result<(), CudaError>;
}
