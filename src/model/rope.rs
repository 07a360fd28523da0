//! The rotary-embedding table the `rope` op reads: (cos, sin) per position and
//! frequency, computed in f64 on the host once at load (model maths, not a kernel).

/// The (cos, sin) table of rotary embedding, (max_pos, head_dim/2) pairs, in f64 then f32.
pub fn rope_table(max_pos: usize, head_dim: usize, theta: f64) -> Vec<f32> {
    rope_table_scaled(max_pos, head_dim, theta, None)
}

/// `rope_table` with a divisor per frequency (Llama 3 scaling).
pub fn rope_table_scaled(max_pos: usize, head_dim: usize, theta: f64, factors: Option<&[f64]>) -> Vec<f32> {
    let half = head_dim / 2;
    let mut t = Vec::with_capacity(max_pos * half * 2);
    for pos in 0..max_pos {
        for i in 0..half {
            let freq = theta.powf(-2.0 * i as f64 / head_dim as f64) / factors.map_or(1.0, |f| f[i]);
            let a = pos as f64 * freq;
            t.push(a.cos() as f32);
            t.push(a.sin() as f32);
        }
    }
    t
}
