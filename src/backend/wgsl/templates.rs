//! The WGSL of every kernel: one template per kernel in `shaders/` (minijinja),
//! rendered to the exact source a pipeline compiles. Register tiles are
//! unrolled by template loops, so the rendered WGSL has no loops over them.
//! `wllm kernels --dump DIR` writes every rendered variant.

use std::sync::OnceLock;

use minijinja::{AutoEscape, Environment, Value};

use crate::gpu::GpuError;

/// Every file in `shaders/` the backend uses, by name: what the kernels are
/// made of (and what keys the persisted pipeline cache).
pub const SHADER_FILES: &[(&str, &str)] = &[
    ("argmax.wgsl", include_str!("../../../shaders/argmax.wgsl")),
    (
        "attention_common.wgsl",
        include_str!("../../../shaders/attention_common.wgsl"),
    ),
    (
        "bench/dequant_roof.wgsl",
        include_str!("../../../shaders/bench/dequant_roof.wgsl"),
    ),
    ("cache_write.wgsl", include_str!("../../../shaders/cache_write.wgsl")),
    (
        "cache_write_tex.wgsl",
        include_str!("../../../shaders/cache_write_tex.wgsl"),
    ),
    ("embed.wgsl", include_str!("../../../shaders/embed.wgsl")),
    ("gemm.wgsl", include_str!("../../../shaders/gemm.wgsl")),
    ("half_pack.wgsl", include_str!("../../../shaders/half_pack.wgsl")),
    (
        "masked_argmax.wgsl",
        include_str!("../../../shaders/masked_argmax.wgsl"),
    ),
    (
        "paged_attention.wgsl",
        include_str!("../../../shaders/paged_attention.wgsl"),
    ),
    (
        "paged_attention_blocked.wgsl",
        include_str!("../../../shaders/paged_attention_blocked.wgsl"),
    ),
    ("rms_norm.wgsl", include_str!("../../../shaders/rms_norm.wgsl")),
    ("rope.wgsl", include_str!("../../../shaders/rope.wgsl")),
    (
        "rope_cache_write.wgsl",
        include_str!("../../../shaders/rope_cache_write.wgsl"),
    ),
    ("act_mul.wgsl", include_str!("../../../shaders/act_mul.wgsl")),
    ("bias_add.wgsl", include_str!("../../../shaders/bias_add.wgsl")),
    ("head_norm.wgsl", include_str!("../../../shaders/head_norm.wgsl")),
    ("elementwise.wgsl", include_str!("../../../shaders/elementwise.wgsl")),
    ("weights.wgsl", include_str!("../../../shaders/weights.wgsl")),
];

/// The text of `name` in `SHADER_FILES` (empty for a name not there, which
/// then fails to compile with the kernel's name in the error).
pub fn file(name: &str) -> &'static str {
    SHADER_FILES.iter().find(|(n, _)| *n == name).map_or("", |(_, s)| s)
}

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // Tag lines vanish from the output (only WGSL lines remain), and a
        // template's last newline is kept, as a file's would be.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(true);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        for (name, src) in SHADER_FILES {
            // The files are compiled into the binary; a syntax error in one is
            // reported when a kernel is rendered from it (below).
            let _ = env.add_template(name, src);
        }
        env
    })
}

/// Renders template `name` with `ctx`.
pub fn render(name: &str, ctx: Value) -> Result<String, GpuError> {
    let shader = |e: minijinja::Error| GpuError::Shader {
        name: name.to_string(),
        message: format!("template: {e:#}"),
    };
    env().get_template(name).map_err(shader)?.render(ctx).map_err(shader)
}
