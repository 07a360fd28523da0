//! `wllm profile` and what it rests on: a recorded step split by kernel keeps
//! every dispatch, recording then finishing gives what `execute` gives, and the
//! command prints a row per kernel against the measured roofs.

mod common;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use wllm::backend::Backend;
use wllm::backend::KvDtype;
use wllm::backend::wgsl::Kernels;
use wllm::engine::{KvCache, KvGroups, ModelRunner, SeqChunk};
use wllm::model::{DecoderModel, ModelFiles};

#[test]
fn a_recorded_step_splits_by_kernel_and_runs_as_execute_does() {
    let dir = test_dir("profile_split");
    let path = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(11));
    let files = ModelFiles::open(&path).unwrap();
    let cfg = files.config().unwrap();
    let ks = Kernels::new(&kernels().ctx).unwrap();
    let model = DecoderModel::load(&ks, &files, &cfg).unwrap();
    let kv = KvCache::new(&ks, &cfg, KvGroups::flat(cfg.layers), KvDtype::F32, 16, 4).unwrap();
    let runner = ModelRunner::new(ks, model, kv, 64, 4, 64).unwrap();
    let ids: Vec<Vec<u32>> = (0..2).map(|s| (0..9).map(|i| 3 + i * 5 + s).collect()).collect();
    let tables = [vec![vec![0u32, 1, 2]], vec![vec![3, 4, 5]]];
    let chunks: Vec<SeqChunk> = (0..2)
        .map(|s| SeqChunk {
            token_ids: &ids[s],
            start: 0,
            len: 9,
            block_tables: &tables[s],
            sample: true,
            logits_from: None,
            hidden: false,
        })
        .collect();
    let (step, rows, sampling) = runner.record(&chunks).unwrap();
    assert_eq!((rows, sampling), (2, 2));
    let total = step.dispatches().count();
    let parts = step.split_by_kernel();
    assert_eq!(parts.iter().map(|(_, p)| p.dispatches().count()).sum::<usize>(), total);
    for (i, (k, _)) in parts.iter().enumerate() {
        assert!(
            parts[..i].iter().all(|(o, _)| o.name != k.name),
            "{} appears twice",
            k.name
        );
    }
    assert!(parts.iter().any(|(k, _)| k.name.starts_with("gemm")));
    for (_, p) in parts {
        p.submit_and_read(&[]).unwrap();
    }
    let recorded = runner.kernels.finish(step, &[(&runner.bufs.act.sampled, 8)]).unwrap();
    let recorded: Vec<u32> = bytemuck::pod_collect_to_vec(&recorded[0]);
    // The same chunks again through execute (the KV rows are rewritten identically).
    let executed = runner.execute(&chunks, false).unwrap().argmax;
    assert_eq!(recorded, executed);
}

#[test]
fn profile_prints_a_row_per_kernel_against_the_roofs() {
    let dir = test_dir("profile_cli");
    let path = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(12));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wllm"))
        .args(["profile", "--model"])
        .arg(&path)
        .args(["--batch", "1,2", "--context", "8", "--prefill", "16", "--reps", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("read roof") && text.contains("FMA roof"), "{text}");
    // The launch cost, measured in the run, and what the step's launches come to.
    assert!(text.contains("µs a dispatch"), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    for (i, title) in lines.iter().enumerate().filter(|(_, l)| l.starts_with("### ")) {
        let count = |s: &str| s.split_whitespace().find_map(|w| w.parse::<usize>().ok());
        let dispatches = title.rsplit(", ").next().and_then(count);
        let launches = lines[i + 1..].iter().find(|l| l.starts_with("launches: ")).copied();
        let n = launches.and_then(|l| l.strip_prefix("launches: ")).and_then(count);
        assert!(dispatches.is_some() && n == dispatches, "{title} / {launches:?}");
    }
    assert!(text.contains("### decode, batch 2, 8 tokens of context each"), "{text}");
    // On CPU adapters (weights as textures), under the one-row step only: the
    // model's matrices at the dequant roof against its gemms.
    let roof_lines: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("dequant roof ("))
        .collect();
    if kernels().ctx.cpu_textures() {
        let b1 = lines.iter().position(|l| l.starts_with("### decode, batch 1,"));
        let b2 = lines.iter().position(|l| l.starts_with("### decode, batch 2,"));
        assert!(
            roof_lines.len() == 1 && b1 < Some(roof_lines[0]) && Some(roof_lines[0]) < b2,
            "{text}"
        );
        let layer_matrices = 4 + 3; // q, k, v, o and gate, up, down: this model fuses neither
        assert!(
            lines[roof_lines[0]].contains(&format!("over the model's {} matrices", 2 * layer_matrices + 1)),
            "{text}"
        );
    } else {
        assert!(roof_lines.is_empty(), "{text}");
    }
    assert!(text.contains("### prefill chunk of 16 tokens"), "{text}");
    for kernel in ["gemm_", "paged_attention_", "rms_norm", "argmax", "embed_"] {
        assert!(text.contains(&format!("| {kernel}")), "no row for {kernel}:\n{text}");
    }
    // Rope with the cache write, and silu·mul: in the gemms' epilogues where
    // the matrices share a format, else their own kernels (this tiny model
    // mixes formats within a layer; a KV cache held as textures, on CPU
    // adapters, takes rope then cache_write_tex instead of rope_cache_write).
    for (epilogue, own) in [
        ("_rope", &["| rope_cache_write", "| cache_write_tex"][..]),
        ("_silu", &["| act_mul"][..]),
    ] {
        let row = text
            .lines()
            .any(|l| (l.starts_with("| gemm_") && l.contains(epilogue)) || own.iter().any(|o| l.starts_with(o)));
        assert!(row, "no row for {epilogue} or {own:?}:\n{text}");
    }
}

/// The texture read roof counts bytes it really reads: read_tex.wgsl visits
/// every texel once (the XOR of all it wrote is the XOR of the texture's
/// words), for row counts that the workgroups do not divide and for more
/// workgroups than rows.
#[test]
fn the_texture_read_roof_reads_every_texel_once() {
    use rand::Rng;
    let ks = kernels();
    let mut r = rng(13);
    for (width, rows, groups) in [(256u32, 37u32, 5u32), (512, 3, 64), (1024, 1, 1)] {
        let words: Vec<u32> = (0..width * rows * 4).map(|_| r.random()).collect();
        let want = words.iter().fold(0u32, |a, w| a ^ w);
        let got = wllm::backend::wgsl::roofs::read_tex_xor(ks, bytemuck::cast_slice(&words), width, rows, groups)
            .expect("read_tex runs");
        assert_eq!(got, want, "{width} x {rows} texels, {groups} workgroups");
    }
}
