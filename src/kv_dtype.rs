//! The element type of the paged KV cache (`--kv-cache-dtype`): what a value
//! costs, the rule every cache writer follows, and the CPU reference of each
//! (`round_trip`, and for q8_0 keys the Walsh–Hadamard rotation).

/// The element type of the paged KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// 4 bytes an element.
    F32,
    /// IEEE half precision, 2 bytes an element: half the memory, values
    /// rounded to 11 significant bits when written (the default).
    #[default]
    F16,
    /// llama.cpp's q8_0: blocks of 32 values as int8 with an f32 scale
    /// (amax / 127), quantised when written; 1.125 bytes a value. A K block
    /// is rotated by the Walsh–Hadamard matrix first (`rotate_block`).
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 3] = [Self::F32, Self::F16, Self::Q8_0];

    /// Bytes of a row of `n` values (one token's K or V in one layer): 4n,
    /// 2n, or for q8_0 n int8 values then an f32 scale per block of 32.
    pub fn row_bytes(self, n: u64) -> u64 {
        match self {
            Self::F32 => 4 * n,
            Self::F16 => 2 * n,
            Self::Q8_0 => n + 4 * n.div_ceil(32),
        }
    }

    /// Bytes a value takes on average (1.125 for q8_0).
    pub fn bytes_per_value(self) -> f64 {
        self.row_bytes(32) as f64 / 32.0
    }

    /// Values a row must be a multiple of (q8_0: whole blocks of 32).
    pub fn row_multiple(self) -> u32 {
        match self {
            Self::F32 => 1,
            Self::F16 => 2,
            Self::Q8_0 => 32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }

    /// A row of values as the cache holds them, back in f32: f16 rounds to
    /// the nearest half (ties to even), q8_0 quantises each block of 32 to
    /// int8 steps of amax / 127 (rounding half away from zero). The CPU
    /// reference of every cache writer, for V rows (and K rows but in q8_0).
    pub fn round_trip(self, row: &[f32]) -> Vec<f32> {
        match self {
            Self::F32 => row.to_vec(),
            Self::F16 => row.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
            Self::Q8_0 => row
                .chunks(32)
                .flat_map(|b| {
                    let (d, q) = q8_block(b);
                    q.into_iter().map(move |q| f32::from(q) * d)
                })
                .collect(),
        }
    }

    /// A K row as the cache holds it, read back: in q8_0 each block of 32 is
    /// rotated by the Walsh–Hadamard matrix (`rotate_block`) before it is
    /// quantised, so the cache holds H·k's values; other dtypes as
    /// `round_trip`.
    pub fn stored_key(self, row: &[f32]) -> Vec<f32> {
        match self {
            Self::Q8_0 => Self::Q8_0.round_trip(&row.chunks(32).flat_map(rotate_block).collect::<Vec<_>>()),
            _ => self.round_trip(row),
        }
    }

    /// A K row as attention sees it: in q8_0 the stored block rotated back
    /// (H·y / 32; attention computes (H·q / 32) · y, the same up to float
    /// rounding); other dtypes as `round_trip`. The CPU reference's keys.
    pub fn key_round_trip(self, row: &[f32]) -> Vec<f32> {
        match self {
            Self::Q8_0 => self
                .stored_key(row)
                .chunks(32)
                .flat_map(|b| rotate_block(b).into_iter().map(|v| v / 32.0))
                .collect(),
            _ => self.round_trip(row),
        }
    }
}

/// A block of values times the Walsh–Hadamard matrix of its length (a power
/// of two; 32 in the cache): y_i = Σ_m (−1)^popcount(i & m) x_m, summed in
/// ascending m in f32 as the cache writers sum it (each term is ±x_m: exact).
/// H is symmetric and H·H = n·I, so rotating twice and dividing by n gives
/// the block back. Why a q8_0 K cache rotates: a key's few large channels
/// (rope's low frequencies) would otherwise set the step of every value in
/// their block; rotated, the block's energy spreads evenly over its 32 values.
pub fn rotate_block(x: &[f32]) -> Vec<f32> {
    (0..x.len())
        .map(|i| {
            x.iter().enumerate().fold(
                0.0f32,
                |y, (m, &v)| {
                    if (i & m).count_ones() % 2 == 0 { y + v } else { y - v }
                },
            )
        })
        .collect()
}

/// A block of up to 32 values as q8_0: the scale amax / 127 and the int8
/// values round(x · 127 / amax), as the cache writers compute them.
pub fn q8_block(b: &[f32]) -> (f32, Vec<i8>) {
    let amax = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    (
        d,
        b.iter().map(|&x| (x * id).round().clamp(-127.0, 127.0) as i8).collect(),
    )
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" | "half" => Ok(Self::F16),
            "q8_0" | "q8" | "int8" => Ok(Self::Q8_0),
            _ => Err(format!("unknown KV cache dtype {s:?}: use f32, f16 or q8_0")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(seed: u64, n: usize) -> Vec<f32> {
        // A small LCG: deterministic values in −1..1.
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn rotating_twice_gives_the_block_back_times_32() {
        let x = rows(1, 32);
        let back: Vec<f32> = rotate_block(&rotate_block(&x)).iter().map(|v| v / 32.0).collect();
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() < 1e-5, "{a} came back as {b}");
        }
        // Row 0 of H is all ones; a one-hot input gives column m of H.
        let mut e = vec![0.0f32; 32];
        e[5] = 1.0;
        let h = rotate_block(&e);
        assert!(
            h.iter()
                .enumerate()
                .all(|(i, &v)| v == if (i & 5).count_ones() % 2 == 0 { 1.0 } else { -1.0 })
        );
        assert_eq!(rotate_block(&x)[0], x.iter().fold(0.0f32, |a, &v| a + v));
    }

    #[test]
    fn rotated_q8_0_keys_lose_less_where_a_channel_dwarfs_the_others() {
        // Rows of 4 blocks, channel 3 of each block 20 times the rest: the
        // plain q8_0 step is set by the large channel; rotated, it is not.
        let mut x = rows(2, 32 * 64);
        for (i, v) in x.iter_mut().enumerate() {
            if i % 32 == 3 {
                *v += 20.0;
            }
        }
        let err = |y: &[f32]| x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
        let plain = err(&KvDtype::Q8_0.round_trip(&x));
        let rotated = err(&KvDtype::Q8_0.key_round_trip(&x));
        assert!(rotated * 4.0 < plain, "rotated {rotated:e} against plain {plain:e}");
        // Gaussian-like values (a sum of four uniforms) lose about the same
        // either way: the rotation of Gaussian values is Gaussian. (Bounded,
        // light-tailed values lose more rotated: keys are not those.)
        let g: Vec<f32> = rows(3, 4 * 32 * 64).chunks(4).map(|c| c.iter().sum()).collect();
        let err = |y: &[f32]| g.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
        let (p, r) = (
            err(&KvDtype::Q8_0.round_trip(&g)),
            err(&KvDtype::Q8_0.key_round_trip(&g)),
        );
        assert!(r < 1.4 * p && p < 1.4 * r, "{r:e} against {p:e}");
        // f16 and f32 keys are not rotated.
        for d in [KvDtype::F32, KvDtype::F16] {
            assert_eq!(d.key_round_trip(&g), d.round_trip(&g));
            assert_eq!(d.stored_key(&g), d.round_trip(&g));
        }
    }
}
