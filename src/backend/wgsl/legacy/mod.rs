//! The string generator the kernels were built with before their templates
//! (kept only to prove the templates render byte-identical WGSL; see the test).

use std::fmt::Write;

use super::attention::AttentionVariant;
use super::gemm::GemmVariant;
use crate::quant::WeightFormat;

/// Declarations of `w` (and `scales`) and the `load_w8(base, c)` helper for `format`,
/// where `base` is the first `w` element of the row and `c` the 8-element chunk.
fn weight_decls(format: WeightFormat, first_binding: u32) -> String {
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

/// Expression decoding sub-block `s` (0..4) of the quantised block held in `q{j}`.
fn dq_sub(format: WeightFormat, j: u32, s: u32) -> String {
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
fn load_block(format: WeightFormat, j: u32, blk: &str) -> String {
    match format {
        WeightFormat::Q8_0 => {
            format!("let qa{j} = w[2u * ({blk})]; let qb{j} = w[2u * ({blk}) + 1u]; let d{j} = scales[{blk}];\n")
        }
        _ => format!("let q{j} = w[{blk}]; let d{j} = scales[{blk}];\n"),
    }
}

const FMA_LANES: [&str; 8] = ["a.x", "a.y", "a.z", "a.w", "b.x", "b.y", "b.z", "b.w"];

/// The full WGSL source of a gemm variant.
pub fn gemm_source(v: GemmVariant) -> String {
    let (tm, tn) = (v.tm, v.tn);
    let mut s = String::new();
    s.push_str(include_str!("gemm.wgsl"));
    s.push_str(include_str!("weights.wgsl"));
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

/// The full WGSL source of an embed variant.
pub fn embed_source(format: WeightFormat) -> String {
    let mut s = String::new();
    s.push_str(include_str!("embed.wgsl"));
    s.push_str(include_str!("weights.wgsl"));
    s.push_str(&weight_decls(format, 2));
    let ob = if format.is_quantized() { 4 } else { 3 };
    let _ = writeln!(s, "@group(0) @binding({ob}) var<storage, read_write> out: array<f32>;");
    s.push_str("@compute @workgroup_size(64)\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n");
    s.push_str("let t = gid.y; let c = gid.x;\nif (t >= p.t || c >= p.chunks) { return; }\n");
    s.push_str(
        "let id = min(ids[t], p.vocab - 1u);\nif (id < p.row0 || id >= p.row0 + p.rows) { return; }\n\
         let row = id - p.row0;\nlet o = t * p.d;\n",
    );
    if format.is_quantized() {
        s.push_str(&load_block(format, 0, "row * p.chunks + c"));
        for sub in 0..4 {
            let v = dq_sub(format, 0, sub);
            let val = match format {
                WeightFormat::Q4_1 => format!(
                    "let v = {v}; put8(o, 32u * c + {}u, F8(v.a * d0.x + d0.y, v.b * d0.x + d0.y));",
                    8 * sub
                ),
                _ => format!("let v = {v}; put8(o, 32u * c + {}u, F8(v.a * d0, v.b * d0));", 8 * sub),
            };
            let _ = writeln!(s, "{{ {val} }}");
        }
    } else {
        s.push_str("put8(o, 8u * c, load_w8(row * p.w_row, c));\n");
    }
    s.push_str("}\n");
    s
}

/// The full WGSL source of an attention variant.
pub fn attention_source(v: AttentionVariant) -> String {
    let (hd, w, g) = (v.head_dim, v.w, v.g);
    let d4 = hd / 4;
    let mut s = String::new();
    let _ = writeln!(s, "const HD: u32 = {hd}u;\nconst W: u32 = {w}u;\nconst G: u32 = {g}u;");
    s.push_str(include_str!("paged_attention.wgsl"));
    s.push_str(
        "var<workgroup> lane_m: array<f32, W * G>;\n\
         var<workgroup> lane_s: array<f32, W * G>;\n\
         var<workgroup> lane_acc: array<vec4<f32>, W * G * HD / 4u>;\n",
    );
    s.push_str(
        "@compute @workgroup_size(W)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {\n\
         let h0 = wid.x * G;\nlet t = wid.y;\nlet l = lid.x;\n\
         let kvh = h0 / (p.heads / p.kv_heads);\n\
         let kv4 = p.kv_heads * HD / 4u;\n\
         let n_keys = positions[t] + 1u;\n\
         let table = token_seq[t] * p.max_blocks;\n",
    );
    for gi in 0..g {
        let _ = writeln!(s, "let qb{gi} = t * p.q_stride + (h0 + {gi}u) * HD;");
        for i in 0..d4 {
            let _ = writeln!(
                s,
                "let q{gi}_{i} = vec4<f32>(q[qb{gi} + {a}u], q[qb{gi} + {b}u], q[qb{gi} + {c}u], q[qb{gi} + {d}u]);",
                a = 4 * i,
                b = 4 * i + 1,
                c = 4 * i + 2,
                d = 4 * i + 3
            );
            let _ = writeln!(s, "var a{gi}_{i} = vec4<f32>(0.0);");
        }
        let _ = writeln!(s, "var m{gi} = NEG;\nvar s{gi} = 0.0;");
    }
    s.push_str(
        "for (var j = l; j < n_keys; j = j + W) {\n\
         let blk = block_tables[table + j / p.block_size];\n\
         let base = (blk * p.block_size + j % p.block_size) * kv4 + kvh * (HD / 4u);\n",
    );
    for i in 0..d4 {
        let _ = writeln!(s, "let k{i} = k_cache[base + {i}u];");
    }
    for gi in 0..g {
        let _ = writeln!(s, "var dot{gi} = 0.0;");
        for i in 0..d4 {
            for c in ["x", "y", "z", "w"] {
                let _ = writeln!(s, "dot{gi} = fma(q{gi}_{i}.{c}, k{i}.{c}, dot{gi});");
            }
        }
        let _ = writeln!(
            s,
            "let sc{gi} = dot{gi} * p.scale;\nlet mn{gi} = max(m{gi}, sc{gi});\n\
             let corr{gi} = exp(m{gi} - mn{gi});\nlet e{gi} = exp(sc{gi} - mn{gi});\n\
             s{gi} = fma(s{gi}, corr{gi}, e{gi});\nm{gi} = mn{gi};"
        );
    }
    for i in 0..d4 {
        let _ = writeln!(s, "let v{i} = v_cache[base + {i}u];");
        for gi in 0..g {
            let _ = writeln!(s, "a{gi}_{i} = fma(a{gi}_{i}, vec4<f32>(corr{gi}), e{gi} * v{i});");
        }
    }
    s.push_str("}\n");
    for gi in 0..g {
        let _ = writeln!(s, "lane_m[l * G + {gi}u] = m{gi};\nlane_s[l * G + {gi}u] = s{gi};");
        for i in 0..d4 {
            let _ = writeln!(s, "lane_acc[(l * G + {gi}u) * (HD / 4u) + {i}u] = a{gi}_{i};");
        }
    }
    s.push_str(
        "workgroupBarrier();\n\
         for (var gi = 0u; gi < G; gi = gi + 1u) {\n\
         var mx = NEG;\n\
         for (var i = 0u; i < W; i = i + 1u) { mx = max(mx, lane_m[i * G + gi]); }\n\
         var total = 0.0;\n\
         for (var i = 0u; i < W; i = i + 1u) { total = fma(lane_s[i * G + gi], exp(lane_m[i * G + gi] - mx), total); }\n\
         for (var d = l; d < HD / 4u; d = d + W) {\n\
         var o = vec4<f32>(0.0);\n\
         for (var i = 0u; i < W; i = i + 1u) {\n\
         o = fma(lane_acc[(i * G + gi) * (HD / 4u) + d], vec4<f32>(exp(lane_m[i * G + gi] - mx)), o);\n\
         }\n\
         let ob = t * p.heads * HD + (h0 + gi) * HD + 4u * d;\n\
         let r = o / total;\n\
         out[ob] = r.x; out[ob + 1u] = r.y; out[ob + 2u] = r.z; out[ob + 3u] = r.w;\n\
         }\n}\n}\n",
    );
    s
}
