//! The oracle check shared by the wgpu and cuda test binaries: the default
//! model against ../shared/oracle (copied to tests/data), llama.cpp's
//! tokenisation and an independent fp32 forward pass. Rule (the oracle's
//! `about`): prompt ids exact; top-5 at the last prompt position equal with
//! values within 0.01; greedy ids equal up to the first step whose reference
//! margin is below 0.01.

use wllm::backend::{Backend, KvDtype};
use wllm::engine::{KvCache, KvGroups, ModelRunner, SeqChunk};
use wllm::model::{DecoderModel, ModelFiles};
use wllm::tokenizer::Tokenizer;

use super::{default_model_path, oracle};

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The default model's tokenizer and a runner on backend `ks` (64 blocks of
/// 16), its KV cache of the default dtype (f16).
pub fn load<B: Backend>(ks: B) -> (Tokenizer, ModelRunner<B>) {
    load_with(ks, KvDtype::default())
}

/// As `load`, the KV cache of `dtype`.
pub fn load_with<B: Backend>(ks: B, dtype: KvDtype) -> (Tokenizer, ModelRunner<B>) {
    let files = ModelFiles::open(&default_model_path()).expect("open model");
    let cfg = files.config().expect("config");
    let ModelFiles::Gguf { file, .. } = &files else {
        panic!("GGUF expected")
    };
    let tok = Tokenizer::from_gguf(file).expect("tokenizer");
    let model = DecoderModel::load(&ks, &files, &cfg).expect("load");
    let kv = KvCache::new(&ks, &cfg, KvGroups::flat(cfg.layers), dtype, 64, 16).expect("kv");
    let runner = ModelRunner::new(ks, model, kv, 512, 4, 1024).expect("runner");
    (tok, runner)
}

/// Prefills every oracle case (in chunks of 100 tokens), checks the top-5 at the
/// last prompt position, then decodes greedily and checks the tokens.
pub fn check_greedy<B: Backend>(tok: &Tokenizer, runner: &ModelRunner<B>) {
    let o = oracle();
    for c in o["cases"].as_array().unwrap() {
        let prompt = ids(&c["prompt_token_ids"]);
        let want = ids(&c["greedy_token_ids"]);
        let margins: Vec<f64> = c["step_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let mut all = prompt.clone();
        let table: Vec<Vec<u32>> = vec![(0..64).collect()];
        // Prefill in chunks of 100 tokens to exercise chunked prefill too.
        let mut start = 0;
        let mut next = 0;
        while start < prompt.len() {
            let len = (prompt.len() - start).min(100);
            let last = start + len == prompt.len();
            let chunk = SeqChunk {
                token_ids: &all,
                start,
                len,
                block_tables: &table,
                sample: last,
                logits_from: None,
                hidden: false,
            };
            let r = runner.execute(&[chunk], last).unwrap();
            if last {
                let logits = r.logits.unwrap();
                let top5 = c["top5_last_prompt_position"].as_array().unwrap();
                for e in top5 {
                    let (id, v) = (e[0].as_u64().unwrap() as usize, e[1].as_f64().unwrap());
                    assert!(
                        (f64::from(logits[id]) - v).abs() < 0.01,
                        "{:?}: logit of {id} is {} want {v}",
                        c["prompt"].as_str(),
                        logits[id]
                    );
                }
                let mut order: Vec<usize> = (0..logits.len()).collect();
                order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                let got5: Vec<u64> = order[..5].iter().map(|&i| i as u64).collect();
                let want5: Vec<u64> = top5.iter().map(|e| e[0].as_u64().unwrap()).collect();
                assert_eq!(got5, want5, "top-5 ids");
                next = r.argmax[0];
            }
            start += len;
        }
        let mut got = vec![next];
        while got.len() < want.len() && *got.last().unwrap() != 2 {
            all.push(*got.last().unwrap());
            let chunk = SeqChunk {
                token_ids: &all,
                start: all.len() - 1,
                len: 1,
                block_tables: &table,
                sample: true,
                logits_from: None,
                hidden: false,
            };
            got.push(runner.execute(&[chunk], false).unwrap().argmax[0]);
        }
        let exact = margins.iter().position(|&m| m < 0.01).unwrap_or(want.len());
        assert_eq!(
            &got[..exact.min(got.len())],
            &want[..exact],
            "{:?}: greedy tokens (text so far {:?})",
            c["prompt"].as_str(),
            tok.decode(&got)
        );
    }
}
