//! `embed`: the row gather of the token embedding in every weight format. The
//! entry point is generated around `shaders/embed.wgsl` and `shaders/weights.wgsl`.

use std::fmt::Write;

use super::gemm::{dq_sub, load_block, weight_decls};
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

/// The full WGSL source for `format`.
pub fn source(format: WeightFormat) -> String {
    let mut s = String::new();
    s.push_str(include_str!("../../../shaders/embed.wgsl"));
    s.push_str(include_str!("../../../shaders/weights.wgsl"));
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
