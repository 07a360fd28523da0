//! `gemm`: Y[T,N] = X[T,K]·W[N,K]ᵀ in every weight format. The WGSL entry point
//! is generated here (fully unrolled register tiles) around the helpers of
//! `shaders/weights.wgsl` and the header of `shaders/gemm.wgsl`, which documents
//! bindings, dispatch shape and the reduction order that makes it batch invariant.

use std::fmt::Write;

use crate::quant::WeightFormat;

/// One compiled variant: format, tile (TM rows x TN columns), workgroup size,
/// and whether X rows may be read as `vec4` (K % 8 == 0 and aligned strides).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmVariant {
    pub format: WeightFormat,
    pub tm: u32,
    pub tn: u32,
    pub wg: u32,
    pub x_vec: bool,
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
    pub pad: [u32; 3],
}

/// Declarations of `w` (and `scales`) and the `load_w8(base, c)` helper for `format`,
/// where `base` is the first `w` element of the row and `c` the 8-element chunk.
pub(crate) fn weight_decls(format: WeightFormat, first_binding: u32) -> String {
    let b = first_binding;
    match format {
        WeightFormat::F32 => format!(
            "@group(0) @binding({b}) var<storage, read> w: array<vec4<f32>>;\n\
             fn load_w8(base: u32, c: u32) -> F8 {{ return F8(w[base + 2u * c], w[base + 2u * c + 1u]); }}\n"
        ),
        WeightFormat::F16 => format!(
            "@group(0) @binding({b}) var<storage, read> w: array<vec4<u32>>;\n\
             fn load_w8(base: u32, c: u32) -> F8 {{ return dq_f16(w[base + c]); }}\n"
        ),
        WeightFormat::Bf16 => format!(
            "@group(0) @binding({b}) var<storage, read> w: array<vec4<u32>>;\n\
             fn load_w8(base: u32, c: u32) -> F8 {{ return dq_bf16(w[base + c]); }}\n"
        ),
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => format!(
            "@group(0) @binding({b}) var<storage, read> w: array<vec4<u32>>;\n\
             @group(0) @binding({}) var<storage, read> scales: array<f32>;\n",
            b + 1
        ),
        WeightFormat::Q4_1 => format!(
            "@group(0) @binding({b}) var<storage, read> w: array<vec4<u32>>;\n\
             @group(0) @binding({}) var<storage, read> scales: array<vec2<f32>>;\n",
            b + 1
        ),
    }
}

/// `w` array elements (vec4) per weight row.
pub fn w_row_len(format: WeightFormat, k: usize) -> usize {
    let kp = k.div_ceil(8) * 8;
    match format {
        WeightFormat::F32 => kp / 4,
        WeightFormat::F16 | WeightFormat::Bf16 => kp / 8,
        WeightFormat::Q8_0 => k / 32 * 2,
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => k / 32,
    }
}

/// Expression decoding sub-block `s` (0..4) of the quantised block held in `q{j}`.
pub(crate) fn dq_sub(format: WeightFormat, j: u32, s: u32) -> String {
    let lanes = ["x", "y", "z", "w"];
    match format {
        WeightFormat::Q8_0 => {
            let v = if s < 2 { "qa" } else { "qb" };
            let (l0, l1) = (lanes[(2 * s % 4) as usize], lanes[(2 * s % 4 + 1) as usize]);
            format!("dq_q8({v}{j}.{l0}, {v}{j}.{l1})")
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let (l0, l1) = (lanes[(2 * s % 4) as usize], lanes[(2 * s % 4 + 1) as usize]);
            let sh = if s < 2 { 0 } else { 4 };
            let off = if format == WeightFormat::Q4_0 { "8.0" } else { "0.0" };
            format!("dq_q4(q{j}.{l0}, q{j}.{l1}, {sh}u, {off})")
        }
        _ => unreachable!("dq_sub on a float format"),
    }
}

/// Statements loading the quantised block `blk` of column `j` into `q{j}` / `qa{j}, qb{j}` and `d{j}`.
pub(crate) fn load_block(format: WeightFormat, j: u32, blk: &str) -> String {
    match format {
        WeightFormat::Q8_0 => {
            format!("let qa{j} = w[2u * ({blk})]; let qb{j} = w[2u * ({blk}) + 1u]; let d{j} = scales[{blk}];\n")
        }
        _ => format!("let q{j} = w[{blk}]; let d{j} = scales[{blk}];\n"),
    }
}

const FMA_LANES: [&str; 8] = ["a.x", "a.y", "a.z", "a.w", "b.x", "b.y", "b.z", "b.w"];

/// The full WGSL source of a variant.
pub fn source(v: GemmVariant) -> String {
    let (tm, tn) = (v.tm, v.tn);
    let mut s = String::new();
    s.push_str(include_str!("../../../shaders/gemm.wgsl"));
    s.push_str(include_str!("../../../shaders/weights.wgsl"));
    if v.x_vec {
        s.push_str(
            "@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;\n\
             fn load_x8(r: u32, c: u32) -> F8 { let i = (r >> 2u) + 2u * c; return F8(x[i], x[i + 1u]); }\n",
        );
    } else {
        s.push_str(
            "@group(0) @binding(1) var<storage, read> x: array<f32>;\n\
             fn xs(r: u32, k: u32) -> f32 { return select(0.0, x[r + k], k < p.k); }\n\
             fn load_x8(r: u32, c: u32) -> F8 { let k = 8u * c;\n\
               return F8(vec4<f32>(xs(r, k), xs(r, k + 1u), xs(r, k + 2u), xs(r, k + 3u)),\n\
                         vec4<f32>(xs(r, k + 4u), xs(r, k + 5u), xs(r, k + 6u), xs(r, k + 7u))); }\n",
        );
    }
    s.push_str(&weight_decls(v.format, 2));
    let yb = if v.format.is_quantized() { 4 } else { 3 };
    let _ = writeln!(s, "@group(0) @binding({yb}) var<storage, read_write> y: array<f32>;");
    let _ = writeln!(s, "@compute @workgroup_size({})", v.wg);
    s.push_str("fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n");
    let _ = writeln!(s, "let n0 = gid.x * {tn}u; let t0 = gid.y * {tm}u;");
    s.push_str("if (n0 >= p.n || t0 >= p.t) { return; }\n");
    for i in 0..tm {
        let _ = writeln!(s, "let r{i} = p.x_off + min(t0 + {i}u, p.t - 1u) * p.x_stride;");
    }
    for j in 0..tn {
        let _ = writeln!(s, "let c{j} = min(n0 + {j}u, p.n - 1u);");
        for i in 0..tm {
            let _ = writeln!(s, "var a{i}_{j} = 0.0;");
        }
    }
    if v.format.is_quantized() {
        s.push_str("for (var b = 0u; b < p.chunks; b = b + 1u) {\n");
        for j in 0..tn {
            s.push_str(&load_block(v.format, j, &format!("c{j} * p.chunks + b")));
            for i in 0..tm {
                let _ = writeln!(s, "var s{i}_{j} = 0.0;");
            }
        }
        let q41 = v.format == WeightFormat::Q4_1;
        if q41 {
            for i in 0..tm {
                let _ = writeln!(s, "var xs{i} = 0.0;");
            }
        }
        for sub in 0..4 {
            s.push_str("{\n");
            for i in 0..tm {
                let _ = writeln!(s, "let x{i} = load_x8(r{i}, 4u * b + {sub}u);");
                if q41 {
                    let sum: Vec<String> = FMA_LANES.iter().map(|l| format!("x{i}.{l}")).collect();
                    let _ = writeln!(s, "xs{i} = xs{i} + {};", sum.join(" + "));
                }
            }
            for j in 0..tn {
                let _ = writeln!(s, "let w{j} = {};", dq_sub(v.format, j, sub));
                for i in 0..tm {
                    for l in FMA_LANES {
                        let _ = writeln!(s, "s{i}_{j} = fma(x{i}.{l}, w{j}.{l}, s{i}_{j});");
                    }
                }
            }
            s.push_str("}\n");
        }
        for j in 0..tn {
            for i in 0..tm {
                if q41 {
                    let _ = writeln!(
                        s,
                        "a{i}_{j} = fma(d{j}.x, s{i}_{j}, a{i}_{j}); a{i}_{j} = fma(d{j}.y, xs{i}, a{i}_{j});"
                    );
                } else {
                    let _ = writeln!(s, "a{i}_{j} = fma(d{j}, s{i}_{j}, a{i}_{j});");
                }
            }
        }
        s.push_str("}\n");
    } else {
        s.push_str("for (var c = 0u; c < p.chunks; c = c + 1u) {\n");
        for i in 0..tm {
            let _ = writeln!(s, "let x{i} = load_x8(r{i}, c);");
        }
        for j in 0..tn {
            let _ = writeln!(s, "let w{j} = load_w8(c{j} * p.w_row, c);");
            for i in 0..tm {
                for l in FMA_LANES {
                    let _ = writeln!(s, "a{i}_{j} = fma(x{i}.{l}, w{j}.{l}, a{i}_{j});");
                }
            }
        }
        s.push_str("}\n");
    }
    for i in 0..tm {
        let _ = writeln!(
            s,
            "if (t0 + {i}u < p.t) {{ let o{i} = p.y_off + (t0 + {i}u) * p.y_stride + n0;"
        );
        for j in 0..tn {
            let _ = writeln!(s, "if (n0 + {j}u < p.n) {{ y[o{i} + {j}u] = a{i}_{j}; }}");
        }
        s.push_str("}\n");
    }
    s.push_str("}\n");
    s
}
