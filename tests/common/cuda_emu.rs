//! The cuda backend's `Executor` on the CPU: the CUDA C of shaders/cuda built
//! with g++ against tests/cuda_emu/runtime.h (an emulation of blocks, threads,
//! __syncthreads and warp shuffles on fibers) and loaded as a shared library. Memory is
//! host memory; device addresses are host addresses. This runs the backend's
//! op layer (grids, argument lists, cuBLAS calls) and its kernels without a GPU.

use std::alloc::Layout;
use std::sync::OnceLock;

use wllm::backend::cuda::CudaError;
use wllm::backend::cuda::{Arg, DeviceMem, Executor, program};

type LaunchFn = unsafe extern "C" fn(*const i8, u32, u32, u32, u32, *const u64, *const u8, u32) -> i32;
type SgemmFn = unsafe extern "C" fn(u32, u32, u32, *const f32, u32, *const f32, u32, *mut f32, u32);

/// Host memory standing in for device memory.
struct HostMem {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the allocation is plain bytes owned by this value; the emulation
// accesses it only during launches the owner's borrowers wait for.
unsafe impl Send for HostMem {}
// SAFETY: as above; no shared mutation happens through `HostMem` itself.
unsafe impl Sync for HostMem {}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

pub struct EmuExecutor {
    /// The emulation keeps its state in globals: one launch at a time per process.
    lock: std::sync::Mutex<()>,
    _lib: libloading::Library,
    launch: LaunchFn,
    sgemm: SgemmFn,
}

/// The emulation built once per test process, or why it cannot be built here.
pub fn emulator() -> Result<&'static EmuExecutor, String> {
    static E: OnceLock<Result<EmuExecutor, String>> = OnceLock::new();
    E.get_or_init(build).as_ref().map_err(|e| e.clone())
}

fn build() -> Result<EmuExecutor, String> {
    let dir = super::test_dir("cuda_emu");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_emu");
    let read = |f: &str| std::fs::read_to_string(root.join(f)).map_err(|e| format!("{f}: {e}"));
    let kernels: String = program::entry_points().iter().map(|n| format!(" K({n})")).collect();
    let src = format!(
        "{}\n{}\n#define EMU_KERNELS{kernels}\n{}",
        read("runtime.h")?,
        program::source(),
        read("launch.h")?
    );
    let cpp = dir.join("emu.cpp");
    let so = dir.join("libwllm_cuda_emu.so");
    std::fs::write(&cpp, src).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("g++")
        .args(["-std=c++20", "-O2", "-shared", "-fPIC", "-w", "-o"])
        .arg(&so)
        .arg(&cpp)
        .output()
        .map_err(|e| format!("g++ is needed to emulate the CUDA kernels on the CPU: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "g++ failed on the CUDA C under emulation:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // SAFETY: the library is the one just built from our sources; it runs no
    // initialisers beyond the C++ runtime's.
    let lib = unsafe { libloading::Library::new(&so) }.map_err(|e| e.to_string())?;
    // SAFETY: the symbols are defined in launch.h with exactly these C signatures.
    let (launch, sgemm) = unsafe {
        (
            *lib.get::<LaunchFn>(b"emu_launch\0").map_err(|e| e.to_string())?,
            *lib.get::<SgemmFn>(b"emu_sgemm_tn\0").map_err(|e| e.to_string())?,
        )
    };
    Ok(EmuExecutor {
        lock: std::sync::Mutex::new(()),
        _lib: lib,
        launch,
        sgemm,
    })
}

/// A handle on the process's emulator (the backend owns a `Box<dyn Executor>`).
pub struct EmuHandle(pub &'static EmuExecutor);

impl Executor for EmuHandle {
    fn describe(&self) -> String {
        "CUDA emulated on the CPU (g++)".into()
    }

    fn total_mem(&self) -> u64 {
        1 << 34
    }

    fn alloc(&self, bytes: u64) -> Result<DeviceMem, CudaError> {
        let layout =
            Layout::from_size_align(bytes.max(16) as usize, 256).map_err(|e| CudaError::Driver(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(CudaError::Driver(format!("out of host memory for {bytes} bytes")));
        }
        Ok(DeviceMem {
            ptr: ptr as u64,
            bytes,
            owner: Box::new(HostMem { ptr, layout }),
        })
    }

    fn write(&self, dst: u64, data: &[u8]) -> Result<(), CudaError> {
        // SAFETY: the backend passes addresses of its own allocations with room
        // for `data` (it checks lengths before calling).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        Ok(())
    }

    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), CudaError> {
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<(), CudaError> {
        let (vals, tags): (Vec<u64>, Vec<u8>) = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => (p, 0),
                Arg::U32(v) => (u64::from(v), 1),
                Arg::F32(v) => (u64::from(v.to_bits()), 2),
            })
            .unzip();
        let cname = std::ffi::CString::new(name).map_err(|e| CudaError::Driver(e.to_string()))?;
        let _one_at_a_time = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: emu_launch checks the name, the argument count and each
        // argument's kind against the kernel's signature before running it; the
        // addresses are live allocations of this executor.
        let rc = unsafe {
            (self.0.launch)(
                cname.as_ptr(),
                grid.0,
                grid.1,
                grid.2,
                block,
                vals.as_ptr(),
                tags.as_ptr(),
                vals.len() as u32,
            )
        };
        match rc {
            0 => Ok(()),
            -1 => Err(CudaError::Driver(format!("no kernel {name}"))),
            -2 => Err(CudaError::Driver(format!(
                "{name}: wrong argument count {}",
                args.len()
            ))),
            -3 => Err(CudaError::Driver(format!(
                "{name}: an argument has the wrong kind: {args:?}"
            ))),
            -5 => Err(CudaError::Driver(format!(
                "{name}: threads wait at different barriers (deadlock)"
            ))),
            _ => Err(CudaError::Driver(format!("{name}: bad block size {block}"))),
        }
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
        // SAFETY: the backend passes matrices of its own allocations with the
        // stated shapes and leading dimensions.
        unsafe { (self.0.sgemm)(m, n, k, a as *const f32, lda, b as *const f32, ldb, c as *mut f32, ldc) };
        Ok(())
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        Ok(())
    }
}
