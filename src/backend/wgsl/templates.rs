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
    use super::super::{embed, gemm, legacy};
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

    fn first_diff(a: &str, b: &str) -> String {
        let (la, lb): (Vec<_>, Vec<_>) = (a.lines().collect(), b.lines().collect());
        let i = la
            .iter()
            .zip(&lb)
            .position(|(x, y)| x != y)
            .unwrap_or(la.len().min(lb.len()));
        format!(
            "line {}: template {:?} / generator {:?} ({} vs {} lines)",
            i + 1,
            la.get(i),
            lb.get(i),
            la.len(),
            lb.len()
        )
    }

    #[test]
    fn templates_render_what_the_generator_wrote() {
        let mut n = 0;
        for format in FORMATS {
            for tm in [1, 4, 8, 16, 32] {
                for tn in [4, 8, 16] {
                    for wg in [8, 64] {
                        for x_vec in [false, true] {
                            let v = GemmVariant {
                                format,
                                tm,
                                tn,
                                wg,
                                x_vec,
                            };
                            let (t, g) = (gemm::source(v).unwrap(), legacy::gemm_source(v));
                            assert!(t == g, "gemm {v:?}: {}", first_diff(&t, &g));
                            n += 1;
                        }
                    }
                }
            }
            let (t, g) = (embed::source(format).unwrap(), legacy::embed_source(format));
            assert!(t == g, "embed {format:?}: {}", first_diff(&t, &g));
        }
        for head_dim in [32, 64, 80, 128, 256] {
            for w in [1, 4, 8, 16, 32] {
                for g in [1, 2, 3, 4, 8] {
                    let v = AttentionVariant { head_dim, w, g };
                    let (t, l) = (attention::source(v).unwrap(), legacy::attention_source(v));
                    assert!(t == l, "attention {v:?}: {}", first_diff(&t, &l));
                }
            }
        }
        assert_eq!(n, 6 * 5 * 3 * 2 * 2);
    }
}
