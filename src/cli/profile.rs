//! `wllm profile`: where a step's milliseconds go, on the WGSL backend. For a
//! decode step at each batch size (each sequence `--context` tokens deep) and
//! a prefill chunk, one row per kernel: its dispatches in the step, the time of
//! those dispatches replayed alone (median; the replay includes recording its
//! bind groups), their share of the whole step, the bytes they must move per
//! second against the read roof and, for gemm and attention, GFLOP/s against
//! the FMA roof (`op_cost` says what is counted). Batched gemms take the row
//! tile `wllm serve`'s warm-up would choose (`RowTileChoice::time_caps`), so
//! the steps run the tiles serving runs. Roofs are measured in the
//! same run (`backend::wgsl::roofs`). Where the adapter offers timestamps inside
//! passes they are not used yet: replaying each kernel alone works everywhere.
//! Under a one-row decode step, on CPU adapters, the model's matrices through
//! the dequant roof kernel (`DequantRoof`) against the step's gemms alone.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use wllm::backend::OpenBackend;
use wllm::backend::wgsl::dequant_roof::DequantRoof;
use wllm::backend::wgsl::{Kernels, roofs};
use wllm::engine::{KvCache, KvGroups, ModelRunner, RowTileChoice, SeqChunk};
use wllm::gpu::StepEncoder;
use wllm::model::{DecoderModel, ModelFiles};

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Decode batch sizes to profile.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub batch: Vec<usize>,
    /// Tokens already in the KV cache of each decoding sequence.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Tokens of the prefill chunk to profile (0: none).
    #[arg(long, default_value_t = 512)]
    pub prefill: usize,
    /// Timed replays of each measurement (the median is shown).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
}

/// The bytes an op's dispatch must move and the flops it must do, from its
/// parameters (the layouts of the `Params` structs in shaders/) and bindings;
/// `keys`: keys attended per layer in this step (attention's reads).
fn op_cost(name: &str, params: &[u8], bufs: &[wllm::gpu::Bound], keys: f64) -> (f64, f64) {
    let p: Vec<f64> = params
        .chunks_exact(4)
        .map(|c| f64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    let at = |i: usize| p.get(i).copied().unwrap_or(0.0);
    let family = name.split('_').next().unwrap_or(name);
    if name == "rope_cache_write" {
        // q and k heads rotated in place, K written to the cache, V copied.
        let (t, hq, hk, hd) = (at(0), at(1), at(2), at(3));
        return (4.0 * t * hd * (2.0 * (hq + hk) + 3.0 * hk) + 4.0 * t * hd, 0.0);
    }
    match family {
        // Y[t,n] = X[t,k] W[n,k]^T: the weight (and scales) once, x and y.
        "gemm" => {
            // Rows r0 (field 16) .. t of the batch: a pass of its row tiles.
            let (t, n, k) = (at(0) - at(16), at(1), at(2));
            // gemm_{format}_...: the weight at binding 2 (and its scales at 3).
            let quantized = name.split('_').nth(1).is_some_and(|f| f.starts_with('Q'));
            let weights: u64 = bufs
                .iter()
                .skip(1)
                .take(1 + usize::from(quantized))
                .map(|b| b.len())
                .sum();
            (weights as f64 + 4.0 * t * (k + n), 2.0 * t * n * k)
        }
        // t rows of d: read x (and the residual, written back), write y.
        "rms" => {
            let (t, d) = (at(0), at(1));
            (4.0 * t * d * (2.0 + 2.0 * at(3)) + 4.0 * d, 0.0)
        }
        // t rows of heads·head_dim rotated in place, and their table rows.
        "rope" => (4.0 * at(0) * at(1) * at(2) * 2.0 + 4.0 * at(0) * at(2), 0.0),
        "silu" => (12.0 * at(0) * at(1), 0.0),
        // t rows of K and V read from qkv and written to the caches.
        "cache" => (16.0 * at(0) * at(1), 0.0),
        "argmax" => (4.0 * at(0) * at(1), 0.0),
        "embed" => (8.0 * at(0) * at(1), 0.0),
        // paged_attention_{hd}x{w}x{g}x{qt}[_kvtex][_sg][_blocked]: each workgroup of g heads
        // and qt tokens reads the K and V rows of its keys once (qt > 1: prefill tiles, whose
        // tokens share their keys: taken as keys / qt rows); q·k and p·v are 2 flops a
        // dimension each.
        "paged" => {
            // The shape is the name's `{hd}x{w}x{g}x{qt}` part (suffixes follow it).
            let shape: Vec<f64> = name
                .split('_')
                .find(|s| s.starts_with(|c: char| c.is_ascii_digit()) && s.contains('x'))
                .unwrap_or("")
                .split('x')
                .filter_map(|x| x.parse().ok())
                .collect();
            let (hd, g, qt) = (
                shape.first().copied().unwrap_or(0.0),
                shape.get(2).copied().unwrap_or(1.0),
                shape.get(3).copied().unwrap_or(1.0).max(1.0),
            );
            let (t, heads) = (at(0), at(1));
            (
                keys / qt * (heads / g) * hd * 8.0 + 8.0 * t * heads * hd,
                keys * heads * hd * 4.0,
            )
        }
        _ => (bufs.iter().map(|b| b.len()).sum::<u64>() as f64, 0.0),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn timed(enc: StepEncoder) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    enc.submit_and_read(&[])?;
    Ok(t0.elapsed().as_secs_f64())
}

/// One scenario's sequences: (token ids, tokens already cached, each KV group's block table).
type Seqs = Vec<(Vec<u32>, usize, Vec<Vec<u32>>)>;

/// `n` sequences of `cached + new` tokens on blocks of their own; every KV
/// group names the same blocks (the groups' layers then overwrite each
/// other's keys, which timing does not mind).
fn sequences(n: usize, cached: usize, new: usize, bs: usize, groups: usize) -> Seqs {
    let blocks = (cached + new).div_ceil(bs);
    (0..n)
        .map(|s| {
            let ids = (0..cached + new)
                .map(|i| 1 + ((i * 7 + s * 13) % 1000) as u32)
                .collect();
            let table: Vec<u32> = (0..blocks).map(|b| (s * blocks + b) as u32).collect();
            (ids, cached, vec![table; groups])
        })
        .collect()
}

/// A profiler row: kernel, dispatches, seconds alone, bytes, flops.
type Row = (String, usize, f64, f64, f64);

/// `roof`, or the best rate (`amount` of a kernel row per second, in units of
/// 1e9) where a kernel beat it: a roof below what a kernel achieved is no
/// roof, so it is raised to that kernel, saying so.
fn raised_roof(
    rows: &[Row],
    roof: f64,
    amount: impl Fn(&Row) -> f64,
    verb: &str,
    unit: &str,
    what: &str,
    prec: usize,
) -> f64 {
    let best = rows
        .iter()
        .filter(|r| !r.0.starts_with('(') && r.2 > 0.0)
        .map(|r| (&r.0, amount(r) / r.2 / 1e9))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match best {
        Some((name, rate)) if rate > roof => {
            println!(
                "({name} {verb} {rate:.prec$} {unit}, above the {what} roof of {roof:.prec$}: that is the {what} roof below)\n"
            );
            rate
        }
        _ => roof,
    }
}

/// A scenario's sequences as the runner's chunks (each sampling its last token).
fn seq_chunks(seqs: &Seqs) -> Vec<SeqChunk<'_>> {
    seqs.iter()
        .map(|(ids, cached, table)| SeqChunk {
            token_ids: ids,
            start: *cached,
            len: ids.len() - cached,
            block_tables: table,
            sample: true,
            logits_from: None,
            hidden: false,
        })
        .collect()
}

fn profile(
    runner: &ModelRunner<Kernels>,
    roofs: &roofs::Roofs,
    title: &str,
    seqs: &Seqs,
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let chunks = seq_chunks(seqs);
    // The whole step, recorded anew for each run as the engine does.
    let mut whole = Vec::new();
    for _ in 0..=reps {
        whole.push(timed(runner.record(&chunks)?.0)?);
    }
    whole.remove(0); // warm-up
    let step_s = median(whole);
    let (step, _, _) = runner.record(&chunks)?;
    let kernels: Vec<String> = step.split_by_kernel().iter().map(|(k, _)| k.name.clone()).collect();
    let mut times = vec![Vec::new(); kernels.len()];
    for rep in 0..=reps {
        for (i, (_, part)) in step.split_by_kernel().into_iter().enumerate() {
            let t = timed(part)?;
            if rep > 0 {
                times[i].push(t);
            }
        }
    }
    // Keys attended in one layer: every new token sees its position + 1 keys.
    let keys: f64 = chunks
        .iter()
        .map(|c| (c.start..c.start + c.len).map(|p| (p + 1) as f64).sum::<f64>())
        .sum();
    let mut rows: Vec<Row> = Vec::new();
    for ((name, t), (_, part)) in kernels.iter().zip(times).zip(step.split_by_kernel()) {
        let secs = median(t);
        let (mut n, mut bytes, mut flops) = (0usize, 0f64, 0f64);
        for (params, bufs, _) in part.dispatches() {
            n += 1;
            let (b, f) = op_cost(name, params, bufs, keys);
            bytes += b;
            flops += f;
        }
        rows.push((name.clone(), n, secs, bytes, flops));
    }
    let dispatches: usize = rows.iter().map(|r| r.1).sum();
    // The step's copies (x rows into the gemm's texture on CPU adapters), timed alone too.
    let (copies, copy_bytes, _) = step.copies();
    if copies > 0 {
        let mut t = Vec::new();
        for rep in 0..=reps {
            let s = timed(step.copies().2)?;
            if rep > 0 {
                t.push(s);
            }
        }
        rows.push(("(copies)".to_string(), copies, median(t), copy_bytes as f64, 0.0));
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    println!(
        "\n### {title}: {:.2} ms a step, {dispatches} dispatches\n",
        step_s * 1e3
    );
    // What the step's launches alone cost at the measured launch cost.
    let launches = dispatches as f64 * roofs.dispatch_s;
    println!(
        "launches: {dispatches} x {:.1} µs = {:.2} ms ({:.0} % of the step)\n",
        roofs.dispatch_s * 1e6,
        launches * 1e3,
        100.0 * launches / step_s
    );
    let read_roof = raised_roof(&rows, roofs.read_gbs, |r| r.3, "moved", "GB/s", "read", 2);
    let fma_roof = raised_roof(&rows, roofs.fma_gflops, |r| r.4, "reached", "GFLOP/s", "FMA", 1);
    println!("| kernel | dispatches | ms alone | % of step | GB/s | % read roof | GFLOP/s | % FMA roof |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, n, secs, bytes, flops) in &rows {
        let (n, secs, bytes, flops) = (*n, *secs, *bytes, *flops);
        let gbs = bytes / secs / 1e9;
        let fl = if flops > 0.0 {
            let g = flops / secs / 1e9;
            format!("{g:.1} | {:.0} %", 100.0 * g / fma_roof)
        } else {
            "– | –".into()
        };
        // Copies run as the driver's memcpy, not through a kernel: no roof applies.
        let read = if name.starts_with('(') {
            "–".to_string()
        } else {
            format!("{:.0} %", 100.0 * gbs / read_roof)
        };
        println!(
            "| {name} | {n} | {:.3} | {:.0} % | {gbs:.2} | {read} | {fl} |",
            secs * 1e3,
            100.0 * secs / step_s,
        );
    }
    Ok(rows)
}

/// At one row: the model's matrices through `dequant_roof.wgsl` (each read
/// and dequantised with nothing else to do, a dispatch a matrix as the
/// gemms), against the step's gemms timed alone (`rows`). Printed where the
/// adapter reads weights as textures (CPU adapters).
fn dequant_roof_line(runner: &ModelRunner<Kernels>, rows: &[Row], reps: usize) -> anyhow::Result<()> {
    let m = &runner.model;
    let mut weights: Vec<_> = m.layers.iter().flat_map(|l| l.matrices()).collect();
    weights.push(m.lm_head.as_ref().unwrap_or(&m.embed));
    let mut roofs = Vec::new();
    for w in &weights {
        match DequantRoof::new(&runner.kernels, w)? {
            Some(r) => roofs.push(r),
            None => return Ok(()),
        }
    }
    let roof_s = DequantRoof::seconds_of(&runner.kernels, &roofs, reps.max(1))?;
    let gemm_s: f64 = rows.iter().filter(|r| r.0.starts_with("gemm_")).map(|r| r.2).sum();
    println!(
        "\ndequant roof (dequant_roof.wgsl over the model's {} matrices, a dispatch each as the gemms): {:.2} ms, against the gemms' {:.2} ms alone: the gemms at {:.0} % of it",
        roofs.len(),
        roof_s * 1e3,
        gemm_s * 1e3,
        100.0 * roof_s / gemm_s
    );
    Ok(())
}

pub fn run(a: &ProfileArgs) -> anyhow::Result<()> {
    let mut cfg = a.engine.config()?;
    cfg.device = wllm::Device::Wgpu;
    let bs = cfg.block_size.max(1);
    let max_batch = a.batch.iter().copied().max().unwrap_or(1).max(1);
    let files = ModelFiles::open_with(&cfg.model, cfg.quantize)?;
    let mc = files.config()?;
    let max_len = (a.context + 1).max(a.prefill).min(mc.max_context);
    let context = a.context.min(max_len - 1);
    let num_blocks = (max_batch * (context + 1).div_ceil(bs))
        .max(a.prefill.div_ceil(bs))
        .max(1);
    let (backend, _) = wllm::backend::open(&cfg)?;
    // Without the cuda feature the match has one arm; with it, two.
    #[allow(clippy::infallible_destructuring_match)]
    let kernels = match backend {
        OpenBackend::Wgpu(k) => *k,
        #[cfg(feature = "cuda")]
        OpenBackend::Cuda(_) => anyhow::bail!("profile measures the WGSL kernels; run it with --device wgpu"),
    };
    println!("adapter: {}", kernels.ctx.describe());
    let roofs = roofs::measure(&kernels)?;
    println!(
        "read roof {:.2} GB/s ({}), FMA roof {:.1} GFLOP/s, launch {:.1} µs a dispatch (dispatch.wgsl, 200 in one submission)",
        roofs.read_gbs,
        roofs.read_kernel,
        roofs.fma_gflops,
        roofs.dispatch_s * 1e6
    );
    let model = DecoderModel::load(&kernels, &files, &mc).context("loading the model")?;
    let max_tokens = max_batch.max(a.prefill).max(1);
    let kv_groups = KvGroups::of(&mc, cfg.hybrid_kv_cache);
    let groups = kv_groups.len();
    let kv = KvCache::new(&kernels, &mc, kv_groups, cfg.kv_dtype(), num_blocks, bs)?;
    let runner = ModelRunner::new(kernels, model, kv, max_tokens, max_batch, max_len)?;
    // The row tile of batched gemms as `wllm serve`'s warm-up chooses it
    // (CPU adapters), so the steps below run the tiles serving runs.
    let tuning = sequences(1, 0, RowTileChoice::TOKENS, bs, groups);
    let chunks = seq_chunks(&tuning);
    let fits = RowTileChoice::TOKENS <= max_tokens && RowTileChoice::TOKENS.div_ceil(bs) <= num_blocks;
    let (_, choice) = RowTileChoice::choose(&runner, RowTileChoice::TOKENS, || {
        Ok::<_, anyhow::Error>(if fits {
            Some(timed(runner.record(&chunks)?.0)? * 1e3)
        } else {
            None
        })
    })?;
    if let Some(c) = choice {
        println!("{}", c.describe());
    }
    for &b in &a.batch {
        let title = format!("decode, batch {b}, {context} tokens of context each");
        let rows = profile(
            &runner,
            &roofs,
            &title,
            &sequences(b.max(1), context, 1, bs, groups),
            a.reps,
        )?;
        if b == 1 {
            dequant_roof_line(&runner, &rows, a.reps)?;
        }
    }
    if a.prefill > 0 {
        let title = format!("prefill chunk of {} tokens", a.prefill.min(max_len));
        profile(
            &runner,
            &roofs,
            &title,
            &sequences(1, 0, a.prefill.min(max_len), bs, groups),
            a.reps,
        )?;
    }
    Ok(())
}
