//! Plain CPU references of the ops, in f64, shared by the kernel tests and the
//! backend op cases.

/// h / sqrt(mean(h²) + eps) · w for one row.
pub fn cpu_rms_norm(h: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = h.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / h.len() as f64;
    let s = 1.0 / (ms + f64::from(eps)).sqrt();
    h.iter()
        .zip(w)
        .map(|(&v, &wv)| (f64::from(v) * s * f64::from(wv)) as f32)
        .collect()
}

/// Rotates `heads` heads of one row in place by position `pos`.
pub fn cpu_rope(x: &mut [f32], pos: usize, heads: usize, hd: usize, theta: f64, adjacent: bool) {
    for h in 0..heads {
        for i in 0..hd / 2 {
            let a = pos as f64 * theta.powf(-2.0 * i as f64 / hd as f64);
            let (c, s) = (a.cos(), a.sin());
            let (ia, ib) = if adjacent {
                (h * hd + 2 * i, h * hd + 2 * i + 1)
            } else {
                (h * hd + i, h * hd + i + hd / 2)
            };
            let (x0, x1) = (f64::from(x[ia]), f64::from(x[ib]));
            x[ia] = (x0 * c - x1 * s) as f32;
            x[ib] = (x0 * s + x1 * c) as f32;
        }
    }
}

/// Softmax(q·Kᵀ/√d)·V over keys 0..=pos, in f64.
pub fn cpu_attention(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], hd: usize) -> Vec<f32> {
    cpu_attention_capped(q, keys, vals, hd, 0.0)
}

/// `cpu_attention` with each score s (q·k/√d) soft-capped to c·tanh(s/c) where c > 0.
pub fn cpu_attention_capped(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], hd: usize, cap: f32) -> Vec<f32> {
    let scale = 1.0 / (hd as f64).sqrt();
    let cap = f64::from(cap);
    let scores: Vec<f64> = keys
        .iter()
        .map(|k| q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * scale)
        .map(|s| if cap > 0.0 { cap * (s / cap).tanh() } else { s })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..hd)
        .map(|d| (e.iter().zip(vals).map(|(w, v)| w * f64::from(v[d])).sum::<f64>() / z) as f32)
        .collect()
}
