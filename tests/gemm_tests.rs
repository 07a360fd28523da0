//! gemm against a CPU reference in every weight format, and its batch invariance.

mod common;

use common::*;
use wllm::backend::wgsl::Rows;
use wllm::backend::{Backend, FusedOps};
use wllm::quant::WeightFormat;

/// Y = X·Wᵀ on the CPU in f64, and Σ|x·w| per element for the tolerance.
fn cpu_gemm(x: &[f32], w: &[f32], t: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; t * n];
    let mut mag = vec![0.0; t * n];
    for i in 0..t {
        for j in 0..n {
            let (mut s, mut m) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let p = f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]);
                s += p;
                m += p.abs();
            }
            y[i * n + j] = s;
            mag[i * n + j] = m;
        }
    }
    (y, mag)
}

fn check_gemm(format: WeightFormat, t: usize, n: usize, seed: u64) {
    check_gemm_on(kernels(), format, t, n, seed);
}

fn check_gemm_on(ks: &wllm::backend::wgsl::Kernels, format: WeightFormat, t: usize, n: usize, seed: u64) {
    let k = awkward_k(format);
    let mut r = rng(seed);
    let (w, wc) = rand_weight(&mut r, format, n, k);
    let x = rand_vec(&mut r, t * k);
    let xb = upload(&x);
    let yb = zeros(t * n);
    let mut enc = encoder();
    ks.gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&yb, n), t as u32)
        .unwrap();
    let got: Vec<f32> = run_read(enc, &[(&yb, t * n)]).remove(0);
    let (want, mag) = cpu_gemm(&x, &wc, t, n, k);
    for i in 0..t * n {
        let err = (f64::from(got[i]) - want[i]).abs();
        assert!(
            err <= 1e-5 * mag[i] + 1e-6,
            "{format:?} T={t} N={n} K={k}: element {i} got {} want {} (err {err})",
            got[i],
            want[i]
        );
    }
}

#[test]
fn gemm_matches_cpu_every_format_and_shape() {
    for (fi, format) in WeightFormat::ALL.into_iter().enumerate() {
        for (si, &(t, n)) in [(1, 49152), (3, 19), (67, 37), (130, 100), (3, 49152)]
            .iter()
            .enumerate()
        {
            check_gemm(format, t, n, (fi * 10 + si) as u64);
        }
    }
}

#[test]
fn gemm_prefill_lm_head_shape() {
    check_gemm(WeightFormat::F16, 67, 49152, 91);
    check_gemm(WeightFormat::Q4_1, 130, 49152, 92);
}

#[test]
fn gemm_aligned_k_uses_vector_loads() {
    // K = 576 (the default model's hidden size): the vec4 load path.
    for format in WeightFormat::ALL {
        let (t, n, k) = (67, 40, 576);
        let mut r = rng(7);
        let (w, wc) = rand_weight(&mut r, format, n, k);
        let x = rand_vec(&mut r, t * k);
        let (xb, yb) = (upload(&x), zeros(t * n));
        let mut enc = encoder();
        kernels()
            .gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&yb, n), t as u32)
            .unwrap();
        let got: Vec<f32> = run_read(enc, &[(&yb, t * n)]).remove(0);
        let (want, mag) = cpu_gemm(&x, &wc, t, n, k);
        for i in 0..t * n {
            assert!(
                (f64::from(got[i]) - want[i]).abs() <= 1e-5 * mag[i] + 1e-6,
                "{format:?} element {i}"
            );
        }
    }
}

/// Row i computed alone (T = 1, decode path) equals row i inside a T = 67 batch
/// (prefill path: 64 rows in full row tiles, then a pass of a smaller tile for
/// the last 3) and inside T = 3 under every row tile, bit for bit.
#[test]
fn gemm_is_batch_invariant() {
    let ks = kernels();
    for format in WeightFormat::ALL {
        for k in [awkward_k(format), 576] {
            let (t, n) = (67usize, 70usize);
            let mut r = rng(11);
            let (w, _) = rand_weight(&mut r, format, n, k);
            let x = rand_vec(&mut r, t * k);
            let xb = upload(&x);
            let batch = zeros(t * n);
            let mut enc = encoder();
            ks.gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&batch, n), t as u32)
                .unwrap();
            let batch: Vec<f32> = run_read(enc, &[(&batch, t * n)]).remove(0);
            for row in [0usize, 5, 31, 63, 66] {
                let xi = upload(&x[row * k..(row + 1) * k]);
                let one = zeros(n);
                let x3 = upload(&x[row.min(64) * k..(row.min(64) + 3) * k]);
                let mut enc = encoder();
                ks.gemm(&mut enc, &w, Rows::new(&xi, k), Rows::new(&one, n), 1).unwrap();
                let tiles = ks.row_tiles(&w);
                let threes: Vec<wgpu::Buffer> = tiles.iter().map(|_| zeros(3 * n)).collect();
                for (tm, out3) in tiles.iter().zip(&threes) {
                    ks.gemm_with(&mut enc, &w, Rows::new(&x3, k), Rows::new(out3, n), 3, *tm)
                        .unwrap();
                }
                let mut reads = vec![(&one, n)];
                reads.extend(threes.iter().map(|b| (b, 3 * n)));
                let out: Vec<Vec<f32>> = run_read(enc, &reads);
                let want = &batch[row * n..(row + 1) * n];
                assert_eq!(
                    bits(&out[0]),
                    bits(want),
                    "{format:?} K={k}: row {row} alone differs from the batch"
                );
                let r3 = row - row.min(64);
                for (i, tm) in tiles.iter().enumerate() {
                    let got = &out[i + 1][r3 * n..(r3 + 1) * n];
                    assert_eq!(
                        bits(got),
                        bits(want),
                        "{format:?} K={k}: row {row} in T=3 with row tile {tm} differs"
                    );
                }
            }
        }
    }
}

/// A row-tile cap (the warm-up's choice, `set_row_tile_cap`) limits the
/// tiles a batch takes and changes no bit of its result.
#[test]
fn a_row_tile_cap_limits_the_tiles_and_keeps_the_bits() {
    let ks = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    let format = WeightFormat::Q4_1;
    let (t, n, k) = (37usize, 200usize, 576usize);
    let mut r = rng(12);
    let (w, _) = rand_weight(&mut r, format, n, k);
    let xb = upload(&rand_vec(&mut r, t * k));
    let full = ks.row_tiles(&w);
    let caps = ks.row_tile_caps(format);
    assert!(caps.windows(2).all(|c| c[0] > c[1]), "largest first: {caps:?}");
    assert!(
        caps.iter().all(|c| full.contains(c) && *c >= 8),
        "{caps:?} not of {full:?}"
    );
    if ks.cpu_shapes {
        assert_eq!(
            caps,
            [16, 8],
            "CPU adapters choose between 16- and 8-row quantised tiles"
        );
    }
    let limits: Vec<u32> = full.iter().copied().filter(|&m| m >= 4).collect();
    let outs: Vec<wgpu::Buffer> = (0..=limits.len()).map(|_| zeros(t * n)).collect();
    let mut enc = encoder();
    ks.gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&outs[0], n), t as u32)
        .unwrap();
    for (&cap, out) in limits.iter().zip(&outs[1..]) {
        ks.set_row_tile_cap(cap);
        let want: Vec<u32> = full.iter().copied().filter(|&m| m <= cap).collect();
        assert_eq!(ks.row_tiles(&w), want, "cap {cap}");
        assert!(ks.row_tile(&w, t as u32) <= cap, "cap {cap}");
        ks.gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(out, n), t as u32)
            .unwrap();
    }
    ks.set_row_tile_cap(u32::MAX);
    assert_eq!(ks.row_tiles(&w), full, "no cap");
    let reads: Vec<(&wgpu::Buffer, usize)> = outs.iter().map(|b| (b, t * n)).collect();
    let got = run_read(enc, &reads);
    for (cap, out) in limits.iter().zip(&got[1..]) {
        assert_eq!(bits(out), bits(&got[0]), "cap {cap}");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Weights over the binding limit are bound in windows of rows; the result is
/// the same, bit for bit, for gemm and embed.
#[test]
fn large_weights_are_bound_in_windows() {
    let mut small = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    small.binding_limit = 16384;
    // GPU shapes read the weight from buffer windows (the CPU shapes from
    // textures): the bits must agree across both.
    small.use_gpu_shapes();
    for format in WeightFormat::ALL {
        let (t, n, k) = (5usize, 300usize, awkward_k(format));
        let mut r = rng(21);
        let (w, _) = rand_weight(&mut r, format, n, k);
        assert!(
            w.windows(16384, 256).unwrap().len() > 1,
            "{format:?}: the test needs several windows"
        );
        let x = rand_vec(&mut r, t * k);
        let ids: Vec<u32> = vec![0, 299, 150, 31, 32];
        let (xb, ib) = (upload(&x), upload(&ids));
        let (y_all, y_win, e_all, e_win) = (zeros(t * n), zeros(t * n), zeros(t * k), zeros(t * k));
        let mut enc = encoder();
        kernels()
            .gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&y_all, n), t as u32)
            .unwrap();
        small
            .gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&y_win, n), t as u32)
            .unwrap();
        kernels().embed(&mut enc, &w, &ib, t as u32, &e_all).unwrap();
        small.embed(&mut enc, &w, &ib, t as u32, &e_win).unwrap();
        let out: Vec<Vec<f32>> = run_read(
            enc,
            &[(&y_all, t * n), (&y_win, t * n), (&e_all, t * k), (&e_win, t * k)],
        );
        assert_eq!(bits(&out[0]), bits(&out[1]), "{format:?} gemm");
        assert_eq!(bits(&out[2]), bits(&out[3]), "{format:?} embed");
    }
}

/// On CPU adapters the engine keeps a weight as textures alone (no storage
/// buffers: one copy of its bytes): gemm and the embedding gather read it
/// there, in several texture windows, with the same bits as from buffers.
#[test]
fn weights_held_as_textures_alone_read_as_buffers_do() {
    use wllm::backend::wgsl::{GemmTiles, GpuWeight, Residency, TexLayout};
    let ctx = &kernels().ctx;
    if !ctx.cpu_textures() {
        // GPUs keep buffers alone: nothing is held twice there either.
        assert_eq!(kernels().residency(), Residency::Buffers);
        eprintln!("this adapter keeps weights in buffers (no weight textures): the buffer paths are tested elsewhere");
        return;
    }
    assert!(matches!(kernels().residency(), Residency::Textures(_)));
    for format in WeightFormat::ALL {
        // Five groups of 24 x 8 rows and a part: three windows of two groups.
        let (t, n, k) = (7usize, 5 * 192 + 37, awkward_k(format));
        let units = if format.is_quantized() { k / 32 } else { k.div_ceil(8) };
        let mut r = rng(31);
        let bytes = rand_weight_bytes(&mut r, format, n, k);
        let rp = wllm::quant::repack_wide(format, &bytes, n, k).unwrap();
        let layout = TexLayout {
            tiles: GemmTiles::cpu(),
            max_rows: 2 * units as u32,
        };
        let tex = GpuWeight::upload_as(ctx, &rp, "tex", Residency::Textures(layout));
        let buf = GpuWeight::upload_as(ctx, &rp, "buf", Residency::Buffers);
        assert!(tex.data.is_none() && tex.scales.is_none(), "{format:?}: buffers kept");
        assert_eq!(tex.tex.len(), 3, "{format:?}: texture windows");
        let tex_bytes: u64 = tex
            .tex
            .iter()
            .map(|t| t.data.len() + t.scales.as_ref().map_or(0, |s| s.len()))
            .sum();
        assert_eq!(tex.gpu_bytes(), tex_bytes, "{format:?}");
        let x = rand_vec(&mut r, t * k);
        let ids: Vec<u32> = vec![0, n as u32 - 1, 191, 192, 383, 384, 800];
        let (xb, ib) = (upload(&x), upload(&ids));
        let (y_tex, y_buf, e_tex, e_buf) = (zeros(t * n), zeros(t * n), zeros(t * k), zeros(t * k));
        let mut enc = encoder();
        kernels()
            .gemm(&mut enc, &tex, Rows::new(&xb, k), Rows::new(&y_tex, n), t as u32)
            .unwrap();
        kernels()
            .gemm(&mut enc, &buf, Rows::new(&xb, k), Rows::new(&y_buf, n), t as u32)
            .unwrap();
        kernels().embed(&mut enc, &tex, &ib, t as u32, &e_tex).unwrap();
        kernels().embed(&mut enc, &buf, &ib, t as u32, &e_buf).unwrap();
        let out: Vec<Vec<f32>> = run_read(
            enc,
            &[(&y_tex, t * n), (&y_buf, t * n), (&e_tex, t * k), (&e_buf, t * k)],
        );
        assert_eq!(bits(&out[0]), bits(&out[1]), "{format:?} gemm");
        assert_eq!(bits(&out[2]), bits(&out[3]), "{format:?} embed");
        // And the gather is the CPU's dequantisation of those rows.
        let cpu = wllm::quant::dequantize(format, &bytes, n, k).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let want = &cpu[id as usize * k..(id as usize + 1) * k];
            assert_eq!(bits(&out[2][i * k..(i + 1) * k]), bits(want), "{format:?} row {id}");
        }
    }
}

/// The tiles chosen for real GPUs (32-lane workgroups, 4x4 / 1x1 tiles) are run
/// on this adapter too: same results as the CPU reference, same bits across tiles.
#[test]
fn gpu_shaped_gemm_matches_cpu() {
    let mut ks = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    ks.use_gpu_shapes();
    for (fi, format) in WeightFormat::ALL.into_iter().enumerate() {
        for (si, &(t, n)) in [(1, 300), (3, 19), (67, 130)].iter().enumerate() {
            check_gemm_on(&ks, format, t, n, (100 + fi * 10 + si) as u64);
        }
        let (t, n, k) = (20usize, 70usize, awkward_k(format));
        let mut r = rng(5);
        let (w, _) = rand_weight(&mut r, format, n, k);
        let xb = upload(&rand_vec(&mut r, t * k));
        let tiles = ks.row_tiles(&w);
        let outs: Vec<wgpu::Buffer> = tiles.iter().map(|_| zeros(t * n)).collect();
        let mut enc = encoder();
        for (tm, y) in tiles.iter().zip(&outs) {
            ks.gemm_with(&mut enc, &w, Rows::new(&xb, k), Rows::new(y, n), t as u32, *tm)
                .unwrap();
        }
        let reads: Vec<(&wgpu::Buffer, usize)> = outs.iter().map(|b| (b, t * n)).collect();
        let got: Vec<Vec<f32>> = run_read(enc, &reads);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                bits(g),
                bits(&got[0]),
                "{format:?}: row tile {} differs from row tile {}",
                tiles[i],
                tiles[0]
            );
        }
    }
}

/// On GPUs a batched pass with few workgroups takes a narrower column tile
/// (`Kernels::min_workgroups`): the same bits as the full tile, for the plain,
/// residual and silu·mul gemms (Q4_1, the default model's format, and f16).
#[test]
fn gpu_column_tiles_narrowed_for_few_workgroups_give_the_same_bits() {
    let mut full = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    full.use_gpu_shapes();
    let mut narrow = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    narrow.use_gpu_shapes();
    narrow.min_workgroups = 1 << 20;
    for (fi, format) in [WeightFormat::Q4_1, WeightFormat::F16].into_iter().enumerate() {
        let (t, n, k) = (16usize, 70usize, 576usize);
        let mut r = rng(400 + fi as u64);
        let (w, _) = rand_weight(&mut r, format, n, k);
        let (x, y0) = (rand_vec(&mut r, t * k), rand_vec(&mut r, t * n));
        let xb = upload(&x);
        let outs: Vec<wgpu::Buffer> = (0..6)
            .map(|i| if i < 4 { upload(&y0) } else { zeros(t * n / 2) })
            .collect();
        let mut enc = encoder();
        for (i, ks) in [&full, &narrow].into_iter().enumerate() {
            let xr = Rows::new(&xb, k);
            ks.gemm(&mut enc, &w, xr, Rows::new(&outs[i], n), t as u32).unwrap();
            ks.gemm_residual(&mut enc, &w, xr, Rows::new(&outs[2 + i], n), t as u32)
                .unwrap();
            // (W's rows taken as interleaved gate/up pairs: 35 outputs.)
            ks.gemm_silu_mul(&mut enc, &w, xr, None, Rows::new(&outs[4 + i], n / 2), t as u32)
                .unwrap();
        }
        let reads: Vec<(&wgpu::Buffer, usize)> = outs
            .iter()
            .enumerate()
            .map(|(i, b)| (b, if i < 4 { t * n } else { t * n / 2 }))
            .collect();
        let got: Vec<Vec<f32>> = run_read(enc, &reads);
        for (what, i) in [("gemm", 0), ("gemm_residual", 2), ("gemm_silu_mul", 4)] {
            assert_eq!(bits(&got[i]), bits(&got[i + 1]), "{format:?} {what}: narrowed tile");
        }
    }
}

/// The kernel bench's dequant roof (`dequant_roof.wgsl`) reads every weight
/// of the gemm's texture layout once and dequantises it as the gemm does:
/// each lane's sum is Σ over its rows of W[row, k] · x[k % 32], against the
/// CPU's dequantised weights, in every format with textures (N = 203: a
/// partial lane group; Q8_0's five blocks: an odd count of scale pairs).
#[test]
fn dequant_roof_reads_and_dequantises_every_weight_once() {
    use wllm::backend::wgsl::dequant_roof;
    let ks = kernels();
    let x = dequant_roof::roof_x();
    let mut tested = 0;
    for (fi, format) in WeightFormat::ALL.into_iter().enumerate() {
        let (n, k) = (203, if format.block().0 == 256 { 768 } else { 160 });
        let (w, wc) = rand_weight(&mut rng(90 + fi as u64), format, n, k);
        let Some(roof) = dequant_roof::DequantRoof::new(ks, &w).unwrap() else {
            // Only adapters without weight textures (GPUs) have no roof.
            assert!(w.tex.is_empty(), "{format:?}: textures but no dequant roof");
            continue;
        };
        let sums = roof.lane_sums().unwrap();
        for (t, got) in w.tex.iter().zip(&sums) {
            let (tn, wg) = (t.tn as usize, t.wg as usize);
            assert_eq!(got.len(), (t.rows as usize).div_ceil(tn * wg) * wg, "{format:?}");
            for (lane, &g) in got.iter().enumerate() {
                let (group, l) = (lane / wg, lane % wg);
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for j in 0..tn {
                    let row = group * tn * wg + l * tn + j;
                    if row >= t.rows as usize {
                        continue;
                    }
                    for kk in 0..k {
                        let p = f64::from(wc[(t.row0 as usize + row) * k + kk]) * f64::from(x[kk % 32]);
                        want += p;
                        mag += p.abs();
                    }
                }
                let err = (f64::from(g) - want).abs();
                assert!(
                    err <= 1e-5 * mag + 1e-6,
                    "{format:?}: lane {lane} got {g} want {want} (err {err})"
                );
            }
        }
        tested += 1;
    }
    // On adapters with weight textures (CPU adapters) every format has a roof.
    if kernels().ctx.cpu_textures() {
        assert_eq!(tested, WeightFormat::ALL.len());
    }
}
