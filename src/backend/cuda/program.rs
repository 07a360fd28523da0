//! The CUDA C program: every kernel file of shaders/cuda/ after common.cuh, one
//! NVRTC compile at start-up for the device's compute capability, and the names
//! of the entry points the backend loads.

use crate::quant::WeightFormat;

/// (file, source) of each kernel file, in program order.
pub const FILES: [(&str, &str); 11] = [
    ("common.cuh", include_str!("../../../shaders/cuda/common.cuh")),
    ("gemm.cu", include_str!("../../../shaders/cuda/gemm.cu")),
    ("embed.cu", include_str!("../../../shaders/cuda/embed.cu")),
    ("rms_norm.cu", include_str!("../../../shaders/cuda/rms_norm.cu")),
    ("rope.cu", include_str!("../../../shaders/cuda/rope.cu")),
    ("act_mul.cu", include_str!("../../../shaders/cuda/act_mul.cu")),
    ("arch_ops.cu", include_str!("../../../shaders/cuda/arch_ops.cu")),
    ("cache_write.cu", include_str!("../../../shaders/cuda/cache_write.cu")),
    ("argmax.cu", include_str!("../../../shaders/cuda/argmax.cu")),
    (
        "masked_argmax.cu",
        include_str!("../../../shaders/cuda/masked_argmax.cu"),
    ),
    (
        "paged_attention.cu",
        include_str!("../../../shaders/cuda/paged_attention.cu"),
    ),
];

/// The whole program as one translation unit, with `#line` marks so that NVRTC
/// errors name the kernel file.
pub fn source() -> String {
    let mut s = String::new();
    for (name, src) in FILES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// The suffix of a format's gemm / embed / dequant entry points.
pub fn format_suffix(f: WeightFormat) -> &'static str {
    match f {
        WeightFormat::F32 => "f32",
        WeightFormat::F16 => "f16",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::Q8_0 => "q8_0",
        WeightFormat::Q4_0 => "q4_0",
        WeightFormat::Q4_1 => "q4_1",
        WeightFormat::Q8_16 => "q8_16",
        f => format_suffix(f.layout()),
    }
}

/// Every entry point of the program.
pub fn entry_points() -> Vec<String> {
    let mut v: Vec<String> = [
        "rms_norm",
        "rope",
        "act_mul",
        "bias_add",
        "head_norm",
        "elementwise",
        "cache_write",
        "argmax",
        "masked_argmax",
        "paged_attention",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for f in WeightFormat::ALL {
        for op in ["gemm", "embed", "dequant"] {
            v.push(format!("{op}_{}", format_suffix(f)));
        }
    }
    v
}

/// NVRTC options for a device of compute capability `major.minor`.
pub fn options(major: i32, minor: i32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{major}{minor}"),
        "--std=c++17".into(),
        // fma contraction stays on (the kernels' fmaf chains are explicit either way).
        "--fmad=true".into(),
    ]
}

/// Whether libnvrtc can be loaded (compiling needs nothing else: no GPU, no driver).
pub fn nvrtc_present() -> bool {
    // SAFETY: only probes whether the shared library can be opened.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the program to PTX for `major.minor`. Needs only libnvrtc (no GPU).
pub fn compile(major: i32, minor: i32) -> Result<cudarc::nvrtc::Ptx, String> {
    if !nvrtc_present() {
        return Err(NVRTC_MISSING.into());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: options(major, minor),
        name: Some("wllm_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source(), opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            format!("NVRTC failed to compile shaders/cuda:\n{}", log.to_string_lossy())
        }
        other => format!("NVRTC failed: {other}"),
    })
}

/// What to do when libnvrtc is missing.
pub const NVRTC_MISSING: &str = "libnvrtc (the CUDA runtime compiler) was not found: install the CUDA toolkit, or \
     `pip install nvidia-cuda-nvrtc-cu12` and add its nvidia/cuda_nvrtc/lib directory to LD_LIBRARY_PATH";
