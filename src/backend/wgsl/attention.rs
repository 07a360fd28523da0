//! `paged_attention`: the template `shaders/paged_attention.wgsl` (bindings,
//! dispatch, reduction order in its header) rendered per head_dim, lanes W and
//! query heads per workgroup G and query tokens QT, with q, the running
//! max/sum and the output accumulators held in vec4 registers, unrolled over
//! head_dim; or, on CPU adapters whose W lanes are one subgroup,
//! `shaders/paged_attention_blocked.wgsl` (keys in blocks of W, a tile of W
//! query tokens a workgroup in prefill steps).

use minijinja::context;

use super::templates::render;
use crate::backend::KvDtype;
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
    /// `paged_attention_blocked.wgsl` (needs `subgroups`): keys in blocks of
    /// W; `qt` is then 1 (decodes) or W (a tile of W tokens a workgroup).
    pub blocked: bool,
    /// A sliding window bounds the keys (`Params.window`); without it the
    /// window's start is the constant 0 and its bounds fold away.
    pub window: bool,
    /// The cache holds halves (an rg32uint texture, or a buffer, of packed
    /// pairs read with `unpack2x16float`).
    pub f16: bool,
    /// A q8_0 cache (a buffer: int8 values, then a scale per block of 32).
    pub q8: bool,
    /// Scores are soft-capped (`Params.softcap`); without it a score is q·k · scale
    /// and no per-key branch is emitted (a 512-token prefill's attention ran
    /// 314 ms against 256 ms with the branch on every key, `wllm profile`).
    pub softcap: bool,
}

/// The WGSL of a variant: `shaders/paged_attention.wgsl` rendered for it.
pub fn source(v: AttentionVariant) -> Result<String, GpuError> {
    if v.blocked {
        if !v.subgroups || (v.qt != 1 && v.qt != v.w) || !v.head_dim.is_multiple_of(4) {
            return Err(GpuError::Limit(format!(
                "blocked attention needs subgroups, 1 or W query tokens and head_dim a multiple of 4: {v:?}"
            )));
        }
        return render(
            "paged_attention_blocked.wgsl",
            context! {
                head_dim => v.head_dim,
                w => v.w,
                g => v.g,
                tile => v.qt > 1,
                kv_tex => v.kv_tex,
                f16 => v.f16,
                q8 => v.q8,
                kv_texel => texel(v),
                window => v.window,
                softcap => v.softcap,
                slots_per_layer => super::kv_tex::SLOTS_PER_LAYER,
            },
        );
    }
    render(
        "paged_attention.wgsl",
        context! {
            head_dim => v.head_dim,
            w => v.w,
            g => v.g,
            qt => v.qt,
            kv_tex => v.kv_tex,
            f16 => v.f16,
            q8 => v.q8,
            kv_texel => texel(v),
            window => v.window,
            softcap => v.softcap,
            subgroups => v.subgroups,
            slots_per_layer => super::kv_tex::SLOTS_PER_LAYER,
        },
    )
}

/// The KV textures' texel format.
fn texel(v: AttentionVariant) -> &'static str {
    super::kv_tex::wgsl_texel(if v.f16 { KvDtype::F16 } else { KvDtype::F32 })
}
