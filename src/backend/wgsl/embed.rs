//! `embed`: the row gather of the token embedding in every weight format,
//! from storage buffers or from a CPU adapter's weight textures; the kernel
//! is the template `shaders/embed.wgsl`.

use minijinja::context;

use super::templates::render;
use super::weight::{scale_binding, scale_pairs};
use crate::gpu::{Binding, GpuError};
use crate::quant::WeightFormat;

/// The uniform parameters, laid out as `Params` in embed.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EmbedParams {
    pub t: u32,
    pub d: u32,
    pub chunks: u32,
    pub w_row: u32,
    pub vocab: u32,
    /// The window of rows bound at binding 2 (see `GpuWeight::windows`).
    pub row0: u32,
    pub rows: u32,
    /// The texture layout (`WeightTex`): columns a lane, lanes a group,
    /// texels a unit, scale texture rows a group.
    pub tn: u32,
    pub wg: u32,
    pub parts: u32,
    pub scale_units: u32,
    pub pad: [u32; 3],
}

/// The WGSL for `format`, reading buffers or (`tex`) textures:
/// `shaders/embed.wgsl` rendered for it.
pub fn source(format: WeightFormat, tex: bool) -> Result<String, GpuError> {
    render(
        "embed.wgsl",
        context! {
            format => format!("{:?}", format.wide_layout()),
            load => format!("{format:?}"),
            qbits => crate::quant::planes::extract_bits(format),
            quantized => format.is_quantized(),
            tex,
            pairs => scale_pairs(format),
            scale_texel => scale_binding(format).wgsl_texel(),
        },
    )
}

/// The storage bindings of the kernel after its uniform.
pub fn bindings(format: WeightFormat, tex: bool) -> Vec<Binding> {
    use Binding::{Read as R, ReadWrite as RW};
    match (format.is_quantized(), tex) {
        (true, false) => vec![R, R, R, RW],
        (false, false) => vec![R, R, RW],
        (true, true) => vec![R, Binding::LoadRgba32Uint, scale_binding(format), RW],
        (false, true) => vec![R, Binding::LoadRgba32Uint, RW],
    }
}
