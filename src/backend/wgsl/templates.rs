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
    ("cache_write.wgsl", include_str!("../../../shaders/cache_write.wgsl")),
    ("embed.wgsl", include_str!("../../../shaders/embed.wgsl")),
    ("gemm.wgsl", include_str!("../../../shaders/gemm.wgsl")),
    (
        "paged_attention.wgsl",
        include_str!("../../../shaders/paged_attention.wgsl"),
    ),
    ("rms_norm.wgsl", include_str!("../../../shaders/rms_norm.wgsl")),
    ("rope.wgsl", include_str!("../../../shaders/rope.wgsl")),
    ("silu_mul.wgsl", include_str!("../../../shaders/silu_mul.wgsl")),
    ("weights.wgsl", include_str!("../../../shaders/weights.wgsl")),
];

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

#[cfg(test)]
mod tests {
    use super::super::attention::{self, AttentionVariant};
    use super::super::{embed, gemm};
    use crate::backend::wgsl::GemmVariant;
    use crate::quant::WeightFormat;

    const FORMATS: [WeightFormat; 6] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Bf16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
    ];

    /// Parses and validates `src` as naga (wgpu's shader compiler) does.
    fn validate(what: &str, src: &str) {
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    }

    // The templates replaced a string generator; before it was removed, a test
    // rendered all these variants byte-identical to it (commit "Kernels as
    // templates"). Now every variant must be valid WGSL with the unrolled tile.
    #[test]
    fn every_variant_renders_valid_wgsl() {
        for format in FORMATS {
            for (tm, tn) in [(1, 4), (1, 16), (4, 8), (8, 8), (16, 16), (32, 16)] {
                for x_vec in [false, true] {
                    let v = GemmVariant {
                        format,
                        tm,
                        tn,
                        wg: 8,
                        x_vec,
                    };
                    let src = gemm::source(v).unwrap();
                    let last = format!("a{}_{} = ", tm - 1, tn - 1);
                    assert!(src.contains(&last), "{v:?}: tile not unrolled");
                    validate(&format!("{v:?}"), &src);
                }
            }
            validate(&format!("embed {format:?}"), &embed::source(format).unwrap());
        }
        for (head_dim, w, g) in [(64, 8, 3), (64, 32, 1), (128, 16, 1), (80, 8, 2), (256, 8, 1)] {
            let v = AttentionVariant { head_dim, w, g };
            validate(&format!("{v:?}"), &attention::source(v).unwrap());
        }
    }

    #[test]
    fn a_template_error_names_the_template() {
        let e = super::render("gemm.wgsl", minijinja::context! { format => "F32" }).unwrap_err();
        assert!(e.to_string().contains("gemm.wgsl"), "{e}");
    }
}
