//! End to end against ../shared/oracle (copied to tests/data): llama.cpp's
//! tokenisation and an independent fp32 forward pass of the default model.
//! Rule (the oracle's `about`): prompt ids exact; top-5 at the last prompt
//! position equal with values within 0.01; greedy ids equal up to the first step
//! whose reference margin is below 0.01.

mod common;

use common::oracle_check::{check_greedy, ids, load_with};
use common::*;
use wllm::backend::KvDtype;
use wllm::backend::wgsl::Kernels;
use wllm::model::ModelFiles;
use wllm::tokenizer::{ChatMessage, Tokenizer};

#[test]
fn tokenizer_matches_llama_cpp() {
    let files = ModelFiles::open(&default_model_path()).expect("open model");
    let ModelFiles::Gguf { file, .. } = &files else {
        panic!("GGUF expected")
    };
    let tok = Tokenizer::from_gguf(file).expect("tokenizer");
    let o = oracle();
    for c in o["tokenizer_cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids(&c["token_ids"]), "tokenising {text:?}");
    }
    for c in o["cases"].as_array().unwrap() {
        let text = c["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode(text).unwrap(),
            ids(&c["prompt_token_ids"]),
            "tokenising {text:?}"
        );
        if let Some(msgs) = c.get("chat_messages") {
            let msgs: Vec<ChatMessage> = serde_json::from_value(msgs.clone()).unwrap();
            assert_eq!(tok.apply_chat_template(&msgs).unwrap(), text, "chat template");
        }
    }
}

/// With the default f16 KV cache and with an f32 one.
#[test]
fn greedy_generation_matches_reference() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let (tok, runner) = load_with(Kernels::new(&kernels().ctx).expect("kernels"), dtype);
        check_greedy(&tok, &runner);
    }
}
