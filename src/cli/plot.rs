//! A small SVG of `bench serve`: output throughput and TTFT p50 against concurrency.

use std::fmt::Write;

/// The figures of one concurrency level.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Level {
    pub concurrency: usize,
    pub num_requests: usize,
    pub duration_s: f64,
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub itl_p50_s: f64,
    pub itl_p99_s: f64,
    pub peak_gpu_memory_allocated_bytes: Option<f64>,
    pub peak_gpu_memory_reserved_bytes: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    /// Share of drafted tokens accepted (wllm with speculative decoding).
    pub spec_acceptance: Option<f64>,
}

/// Two panels side by side, log-spaced x (concurrency).
pub fn svg(levels: &[Level], model: &str) -> String {
    let (w, h, pad) = (360.0, 260.0, 50.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">",
        2.0 * w,
        h + 30.0
    );
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"18\">wllm bench serve: {}</text>",
        model.replace('<', "&lt;")
    );
    let xs: Vec<f64> = levels.iter().map(|l| (l.concurrency as f64).log2()).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    let panels: [(&str, Vec<f64>, &str); 2] = [
        (
            "output tokens/s",
            levels.iter().map(|l| l.output_tokens_per_s).collect(),
            "#1f77b4",
        ),
        ("TTFT p50 (s)", levels.iter().map(|l| l.ttft_p50_s).collect(), "#d62728"),
    ];
    for (pi, (title, ys, color)) in panels.iter().enumerate() {
        let ox = pi as f64 * w;
        let ymax = ys.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.1;
        let px = |x: f64| ox + pad + if x1 > x0 { (x - x0) / (x1 - x0) } else { 0.5 } * (w - 2.0 * pad);
        let py = |y: f64| 30.0 + h - pad - y / ymax * (h - 2.0 * pad);
        let _ = writeln!(s, "<text x=\"{}\" y=\"44\">{title}</text>", ox + pad);
        let _ = writeln!(
            s,
            "<line x1=\"{a}\" y1=\"{b}\" x2=\"{c}\" y2=\"{b}\" stroke=\"black\"/><line x1=\"{a}\" y1=\"{d}\" x2=\"{a}\" y2=\"{b}\" stroke=\"black\"/>",
            a = ox + pad,
            b = py(0.0),
            c = ox + w - pad,
            d = py(ymax)
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\">{:.3}</text>",
            ox + 4.0,
            py(ymax) + 4.0,
            ymax
        );
        let pts: Vec<String> = xs
            .iter()
            .zip(ys)
            .map(|(&x, &y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for (l, (&x, &y)) in levels.iter().zip(xs.iter().zip(ys)) {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                px(x),
                py(y)
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                px(x),
                py(0.0) + 16.0,
                l.concurrency
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\">concurrency</text>",
            ox + w / 2.0 - 30.0,
            h + 24.0
        );
    }
    s.push_str("</svg>\n");
    s
}
