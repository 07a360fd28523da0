//! Every kernel variant this adapter's engine can run, rendered: what
//! `wllm kernels --dump DIR` writes, so the WGSL that runs can be read.

use super::{Kernels, attention, embed, gemm, templates};
use crate::backend::KvDtype;
use crate::gpu::GpuError;
use crate::quant::WeightFormat;

/// One rendered kernel: a file name and its WGSL.
#[derive(Clone, Debug)]
pub struct RenderedKernel {
    pub file: String,
    pub source: String,
}

/// The kernels that are plain WGSL (not templates), by name.
const FIXED: [&str; 8] = [
    "rms_norm",
    "rope",
    "rope_cache_write",
    "act_mul",
    "bias_add",
    "head_norm",
    "elementwise",
    "masked_argmax",
];

impl Kernels {
    /// Every variant for a model with this attention shape: the fixed kernels,
    /// gemm in every format × row tile × x layout × epilogue, embed in every format, and
    /// the attention variant chosen for `head_dim` and the GQA group.
    pub fn rendered_variants(&self, head_dim: u32, heads: u32, kv_heads: u32) -> Result<Vec<RenderedKernel>, GpuError> {
        let mut out: Vec<RenderedKernel> = FIXED
            .iter()
            .map(|name| {
                let file = format!("{name}.wgsl");
                let source = templates::file(&file).to_string();
                RenderedKernel { file, source }
            })
            .collect();
        // (q8_0 caches are buffers only.)
        for (tex, dtype) in [(false, KvDtype::Q8_0)].into_iter().chain(
            [false, true]
                .into_iter()
                .flat_map(|t| [(t, KvDtype::F32), (t, KvDtype::F16)]),
        ) {
            {
                let (name, source) = super::cache_write_source(tex, dtype)?;
                out.push(RenderedKernel {
                    file: format!("{name}.wgsl"),
                    source,
                });
            }
        }
        let wg = self.argmax_wg();
        out.push(RenderedKernel {
            file: format!("argmax_wg{wg}.wgsl"),
            source: templates::render("argmax.wgsl", minijinja::context! { wg => wg })?,
        });
        for format in WeightFormat::ALL {
            for tm in self.row_tiles_of(format) {
                // (x rows as vec4, silu epilogue, rope epilogue, the layer's
                // norm fused: its prologue or the residual epilogue).
                for (x_vec, silu, rope, fused) in [
                    (true, false, false, false),
                    (true, false, false, true),
                    (false, false, false, false),
                    (true, true, false, true),
                    (true, false, true, true),
                ] {
                    let mut v = self.gemm_variant_of(format, tm, x_vec, silu, rope);
                    v.w_tex = self.cpu_shapes;
                    v.x_tex = self.cpu_shapes && x_vec;
                    // (K: the model's hidden size, the heads' width.)
                    v.x_lanes = v.x_tex && self.x_lanes(format, (heads * head_dim) as usize);
                    // CPU adapters hold the KV cache as textures (kv_tex.rs).
                    v.kv_tex = rope && self.cpu_shapes && v.tn.is_multiple_of(8);
                    v.kv_f16 = rope;
                    // The layer's norms fused (`fuses_norm`: x as vec4 rows):
                    // the qkv and gate·up gemms normalise x, the others add
                    // into the residual stream.
                    v.norm = fused && (silu || rope);
                    v.residual = fused && !(silu || rope);
                    let layout = if x_vec { "xvec4" } else { "xscalar" };
                    let epilogue = match (silu, rope) {
                        (true, _) => "_silu",
                        (false, true) => "_rope",
                        (false, false) => "",
                    };
                    let tex = match (v.w_tex, v.kv_tex) {
                        (true, true) => "_tex_kvtex",
                        (true, false) => "_tex",
                        _ => "",
                    };
                    let fused = match (v.norm, v.residual) {
                        (true, _) => "_norm",
                        (false, true) => "_res",
                        _ => "",
                    };
                    out.push(RenderedKernel {
                        file: format!(
                            "gemm_{format:?}_{}x{}_wg{}_{layout}{epilogue}{tex}{fused}.wgsl",
                            v.tm, v.tn, v.wg
                        ),
                        source: gemm::source(v)?,
                    });
                }
            }
            let tex = matches!(self.residency(), super::Residency::Textures(_));
            out.push(RenderedKernel {
                file: format!("embed_{format:?}{}.wgsl", if tex { "_tex" } else { "" }),
                source: embed::source(format, tex)?,
            });
        }
        // Decode-sized and prefill-sized steps (the token tile may differ).
        let group = heads / kv_heads.max(1);
        let (mut decode, mut prefill) = (
            self.attention_variant(head_dim, group, 1, 1),
            self.attention_variant(head_dim, group, 512, 512),
        );
        (decode.kv_tex, prefill.kv_tex) = (self.cpu_shapes, self.cpu_shapes);
        // The default KV cache holds halves.
        (decode.f16, prefill.f16) = (true, true);
        for v in [decode, prefill]
            .into_iter()
            .take(if decode == prefill { 1 } else { 2 })
        {
            out.push(RenderedKernel {
                file: format!(
                    "paged_attention_hd{}_w{}_g{}_qt{}{}{}_f16.wgsl",
                    v.head_dim,
                    v.w,
                    v.g,
                    v.qt,
                    if v.kv_tex { "_kvtex" } else { "" },
                    if v.subgroups { "_sg" } else { "" }
                ),
                source: attention::source(v)?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::{self, AttentionVariant};
    use super::super::gemm::GemmVariant;
    use super::super::{embed, gemm, templates};

    use crate::quant::WeightFormat;

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
    fn every_float_gemm_and_embed_variant_renders_valid_wgsl() {
        check_gemm_and_embed(|f| !f.is_quantized());
    }

    // (Split by format so that the test threads validate them side by side.)
    #[test]
    fn every_quantised_gemm_and_embed_variant_renders_valid_wgsl() {
        check_gemm_and_embed(|f| f.is_quantized());
    }

    fn check_gemm_and_embed(which: impl Fn(WeightFormat) -> bool) {
        for format in WeightFormat::ALL.into_iter().filter(|&f| which(f)) {
            // (The default tiles give quantised formats at most 16 rows; 32 only renders more of the same.)
            let tiles = [(1, 4), (1, 16), (4, 8), (8, 8), (16, 16), (32, 16)];
            for (tm, tn) in tiles.into_iter().filter(|&(tm, _)| tm < 32 || !format.is_quantized()) {
                for (x_vec, silu, w_tex, x_tex, rope) in [
                    (false, false, false, false, false),
                    (true, false, false, false, false),
                    (true, true, false, false, false),
                    (false, false, true, false, false),
                    (true, true, true, true, false),
                    (true, false, false, true, false),
                    (true, false, true, true, true),
                    (false, false, false, false, true),
                ] {
                    let v = GemmVariant {
                        format,
                        tm,
                        tn,
                        wg: 8,
                        x_vec,
                        silu,
                        w_tex,
                        x_tex,
                        x_lanes: false,
                        rope,
                        kv_tex: false,
                        kv_f16: false,
                        norm: false,
                        residual: false,
                    };
                    let src = gemm::source(v).unwrap();
                    let last = format!("a{}_{} = ", tm - 1, tn - 1);
                    assert!(src.contains(&last), "{v:?}: tile not unrolled");
                    assert_eq!(src.contains("exp(-g)"), silu, "{v:?}: epilogue");
                    assert_eq!(src.contains("store_pair(t0"), rope, "{v:?}: epilogue");
                    validate(&format!("{v:?}"), &src);
                    if rope {
                        // A cache of packed halves.
                        let v = GemmVariant { kv_f16: true, ..v };
                        let src = gemm::source(v).unwrap();
                        assert!(src.contains("array<u32>") && !src.contains("k_cache[slot"), "{v:?}");
                        validate(&format!("{v:?}"), &src);
                    }
                    if rope && tn % 8 == 0 {
                        // The cache as textures: whole texels from groups of 8 rows.
                        for kv_f16 in [false, true] {
                            let v = GemmVariant {
                                kv_tex: true,
                                kv_f16,
                                ..v
                            };
                            let src = gemm::source(v).unwrap();
                            assert!(src.contains("store_group(t0") && !src.contains("store_pair("), "{v:?}");
                            assert_eq!(src.contains("rg32uint"), kv_f16, "{v:?}");
                            validate(&format!("{v:?}"), &src);
                        }
                    }
                    if x_vec && (tm == 1 || tm == 16) {
                        // Fused layers: the norm prologue (qkv, gate·up) or the
                        // residual epilogue (o, down); the norm weight a texture
                        // beside an x texture, else a buffer (GPU shapes).
                        let norm = silu || rope;
                        let v = GemmVariant {
                            norm,
                            residual: !norm,
                            kv_tex: rope && tn % 8 == 0,
                            ..v
                        };
                        let src = gemm::source(v).unwrap();
                        assert_eq!(src.contains("row_inv(ss0)"), norm, "{v:?}");
                        assert_eq!(src.contains("= y[o0 + 0u] + a0_0"), !norm, "{v:?}");
                        assert_eq!(src.contains("var<storage, read> norm_w"), norm && !x_tex, "{v:?}");
                        validate(&format!("{v:?}"), &src);
                        if !x_tex {
                            continue;
                        }
                        // x texels shared across the lanes (subgroups of 8 or more).
                        let v = GemmVariant { x_lanes: true, ..v };
                        let src = gemm::source(v).unwrap();
                        assert!(src.contains("subgroupBroadcast(xt0, 7u)"), "{v:?}");
                        assert!(!src.contains("load_x8(r0"), "{v:?}");
                        validate(&format!("{v:?}"), &src);
                    }
                }
            }
            for tex in [false, true] {
                validate(
                    &format!("embed {format:?} tex {tex}"),
                    &embed::source(format, tex).unwrap(),
                );
            }
        }
    }

    #[test]
    fn every_attention_variant_renders_valid_wgsl() {
        for (head_dim, w, g, qt) in [
            (64, 8, 3, 2),
            (64, 32, 1, 1),
            (128, 16, 1, 1),
            (80, 8, 2, 2),
            (256, 8, 1, 3),
        ] {
            for (kv_tex, subgroups, f16, q8) in [
                (false, false, false, false),
                (false, false, true, false),
                (false, true, false, true),
                (true, false, false, false),
                (true, true, true, false),
            ] {
                let v = AttentionVariant {
                    head_dim,
                    w,
                    g,
                    qt,
                    kv_tex,
                    subgroups,
                    blocked: false,
                    f16,
                    q8,
                    window: kv_tex,
                    softcap: subgroups,
                };
                let src = attention::source(v).unwrap();
                assert_eq!(src.contains("fn q8x4"), q8, "{v:?}");
                assert_eq!(src.contains("textureLoad(k_tex"), kv_tex, "{v:?}");
                assert_eq!(src.contains("unpack2x16float"), f16, "{v:?}");
                assert_eq!(src.contains("rg32uint"), f16 && kv_tex, "{v:?}");
                assert_eq!(src.contains("p.softcap"), v.softcap, "{v:?}");
                assert_eq!(src.contains("p.window"), v.window, "{v:?}");
                validate(&format!("{v:?}"), &src);
            }
            // Keys in blocks of W: decodes and tiles of W tokens.
            for (kv_tex, qt) in [(false, 1), (true, 1), (false, w), (true, w)] {
                let v = AttentionVariant {
                    head_dim,
                    w,
                    g,
                    qt,
                    kv_tex,
                    subgroups: true,
                    blocked: true,
                    f16: qt == 1 && kv_tex,
                    q8: qt == 1 && !kv_tex,
                    window: qt > 1,
                    softcap: kv_tex,
                };
                let src = attention::source(v).unwrap();
                assert_eq!(src.contains("textureLoad(k_tex"), kv_tex, "{v:?}");
                assert_eq!(src.contains("n_max"), qt > 1, "{v:?}");
                validate(&format!("{v:?}"), &src);
            }
            let v = AttentionVariant {
                head_dim,
                w,
                g,
                qt: 2,
                kv_tex: false,
                subgroups: false,
                blocked: true,
                f16: false,
                q8: false,
                window: false,
                softcap: false,
            };
            assert!(attention::source(v).is_err(), "{v:?}");
        }
    }

    #[test]
    fn argmax_renders_valid_wgsl_at_both_workgroup_sizes() {
        for wg in [64, 256] {
            let src = templates::render("argmax.wgsl", minijinja::context! { wg => wg }).unwrap();
            assert!(src.contains(&format!("@workgroup_size({wg})")), "{src}");
            validate(&format!("argmax wg {wg}"), &src);
        }
    }

    #[test]
    fn every_fixed_kernel_has_its_file() {
        for name in super::FIXED {
            assert!(!templates::file(&format!("{name}.wgsl")).is_empty(), "{name}");
        }
        assert!(templates::file("no_such.wgsl").is_empty());
    }

    #[test]
    fn a_template_error_names_the_template() {
        let e = templates::render("gemm.wgsl", minijinja::context! { format => "F32" }).unwrap_err();
        assert!(e.to_string().contains("gemm.wgsl"), "{e}");
    }
}
