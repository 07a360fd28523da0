//! `embed`: the row gather of the token embedding in every weight format; the
//! kernel is the template `shaders/embed.wgsl`.

use minijinja::context;

use super::templates::render;
use crate::gpu::GpuError;
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
    pub pad: u32,
}

/// The WGSL for `format`: `shaders/embed.wgsl` rendered for it.
pub fn source(format: WeightFormat) -> Result<String, GpuError> {
    render(
        "embed.wgsl",
        context! {
            format => format!("{format:?}"),
            quantized => format.is_quantized(),
        },
    )
}
