//! `gemm`: Y[T,N] = X[T,K]·W[N,K]ᵀ in every weight format. The kernel is the
//! template `shaders/gemm.wgsl` (bindings, dispatch shape and the reduction
//! order that makes it batch invariant are in its header); a variant fixes the
//! weight format, the register tile and the x layout.

use minijinja::context;

use super::templates::render;
use crate::gpu::GpuError;
use crate::quant::WeightFormat;

/// One compiled variant: format, tile (TM rows x TN columns), workgroup size,
/// whether X rows may be read as `vec4` (K % 8 == 0 and aligned strides), and
/// whether the silu·mul epilogue writes silu(gate)·up of interleaved rows (TN even).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmVariant {
    pub format: WeightFormat,
    pub tm: u32,
    pub tn: u32,
    pub wg: u32,
    pub x_vec: bool,
    pub silu: bool,
    /// Weights (and scales) read from textures (`GpuWeight::tex`).
    pub w_tex: bool,
    /// x rows read from a texture they are copied into (`Kernels::x_texture`).
    pub x_tex: bool,
    /// With `x_tex` (float formats: K a multiple of 32): each lane fetches
    /// one texel of a block's x row (and norm weight) and the lanes share them with
    /// `subgroupBroadcast` (one texel fetch where each lane made eight;
    /// the workgroup's lanes in subgroups of at least 8, `Kernels::x_lanes`).
    pub x_lanes: bool,
    /// The rope epilogue (qkv rows, rotated pairs adjacent; TN even): rotates
    /// q and k and writes K and V to the paged cache too.
    pub rope: bool,
    /// The rope epilogue writes the cache as textures (`kv_tex`; TN a multiple of 8).
    pub kv_tex: bool,
    /// The rope epilogue's cache holds halves (rg32uint textures of packed halves, or a
    /// buffer of packed pairs: adjacent rotary pairs only).
    pub kv_f16: bool,
    /// The rms_norm prologue: x rows normalised as they are read (the norm
    /// weight a texture where x is one, else a `vec4` buffer).
    pub norm: bool,
    /// The residual epilogue: y += the tile.
    pub residual: bool,
}

/// The uniform parameters, laid out as `Params` in gemm.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemmParams {
    pub t: u32,
    pub n: u32,
    pub k: u32,
    pub chunks: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub x_off: u32,
    pub y_off: u32,
    pub w_row: u32,
    /// Rope epilogue only (zero otherwise): see gemm.wgsl's `Params`.
    pub col0: u32,
    pub q_w: u32,
    pub kv_w: u32,
    pub hd: u32,
    pub pairing: u32,
    pub max_pos: u32,
    /// Norm prologue only: the rms_norm's epsilon.
    pub eps: f32,
    /// The first row of this dispatch (rows r0..t; a batch split into a
    /// pass of large row tiles and one of small tiles for the rest).
    pub r0: u32,
    pub _pad: [u32; 3],
}

/// The WGSL of a variant: `shaders/gemm.wgsl` rendered for it.
pub fn source(v: GemmVariant) -> Result<String, GpuError> {
    render(
        "gemm.wgsl",
        context! {
            // The arithmetic is the wide layout's; `load` reads the layout
            // held (a narrow one rebuilds the wide one's words and factors).
            format => format!("{:?}", v.format.wide_layout()),
            load => format!("{:?}", v.format),
            qbits => crate::quant::planes::extract_bits(v.format),
            quantized => v.format.is_quantized(),
            tm => v.tm,
            tn => v.tn,
            wg => v.wg,
            x_vec => v.x_vec,
            silu => v.silu,
            w_tex => v.w_tex,
            x_tex => v.x_tex,
            x_lanes => v.x_lanes,
            rope => v.rope,
            kv_tex => v.kv_tex,
            kv_f16 => v.kv_f16,
            kv_texel => super::kv_tex::wgsl_texel(if v.kv_f16 { crate::backend::KvDtype::F16 } else { crate::backend::KvDtype::F32 }),
            norm => v.norm,
            residual => v.residual,
            scale_texel => super::weight::scale_binding(v.format).wgsl_texel(),
            // Scale textures of two blocks a texel (`weight::scale_pairs`):
            // the block loop steps two blocks, one scale fetch a column.
            pairs => v.w_tex && super::weight::scale_pairs(v.format),
            slots_per_layer => super::kv_tex::SLOTS_PER_LAYER,
        },
    )
}
