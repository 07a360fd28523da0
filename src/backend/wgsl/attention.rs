//! `paged_attention`: the entry point is generated around the header of
//! `shaders/paged_attention.wgsl` (bindings, dispatch, reduction order) with q,
//! the running max/sum and the output accumulators of G heads held in vec4
//! registers, fully unrolled over head_dim.

use std::fmt::Write;

/// One compiled variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionVariant {
    pub head_dim: u32,
    /// Lanes per workgroup.
    pub w: u32,
    /// Query heads per workgroup.
    pub g: u32,
}

/// The full WGSL source of a variant.
pub fn source(v: AttentionVariant) -> String {
    let (hd, w, g) = (v.head_dim, v.w, v.g);
    let d4 = hd / 4;
    let mut s = String::new();
    let _ = writeln!(s, "const HD: u32 = {hd}u;\nconst W: u32 = {w}u;\nconst G: u32 = {g}u;");
    s.push_str(include_str!("../../../shaders/paged_attention.wgsl"));
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
