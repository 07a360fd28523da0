//! `paged_attention`: the template `shaders/paged_attention.wgsl` (bindings,
//! dispatch, reduction order in its header) rendered per head_dim, lanes W and
//! query heads per workgroup G and query tokens QT, with q, the running
//! max/sum and the output accumulators held in vec4 registers, unrolled over
//! head_dim.

use minijinja::context;

use super::templates::render;
use crate::gpu::GpuError;

/// One compiled variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionVariant {
    pub head_dim: u32,
    /// Lanes per workgroup.
    pub w: u32,
    /// Query heads per workgroup.
    pub g: u32,
    /// Query tokens per workgroup (sharing K/V loads when of one sequence).
    pub qt: u32,
    /// K and V read from textures (`kv_tex`) rather than storage buffers.
    pub kv_tex: bool,
    /// The W lanes are one subgroup and merge with subgroup operations.
    pub subgroups: bool,
}

/// The WGSL of a variant: `shaders/paged_attention.wgsl` rendered for it.
pub fn source(v: AttentionVariant) -> Result<String, GpuError> {
    render(
        "paged_attention.wgsl",
        context! {
            head_dim => v.head_dim,
            w => v.w,
            g => v.g,
            qt => v.qt,
            kv_tex => v.kv_tex,
            subgroups => v.subgroups,
            slots_per_layer => super::kv_tex::SLOTS_PER_LAYER,
        },
    )
}
