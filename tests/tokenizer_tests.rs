//! Incremental detokenisation never emits a broken UTF-8 character.

mod common;

use common::*;
use wllm::model::ModelFiles;
use wllm::tokenizer::{IncrementalDecoder, Tokenizer};

#[test]
fn incremental_decoding_emits_whole_characters_only() {
    let files = ModelFiles::open(&default_model_path()).unwrap();
    let ModelFiles::Gguf { file, .. } = &files else {
        panic!("GGUF expected")
    };
    let tok = Tokenizer::from_gguf(file).unwrap();
    for text in [
        "naïve café 🙂 and 日本語のテキスト, émojis 🎉🎉!",
        "plain ascii text",
        "Ünïcödé\n\ttabs 🙂",
    ] {
        let prompt = tok.encode("Say:").unwrap();
        let generated = tok.encode(text).unwrap();
        let mut ids = prompt.clone();
        let mut dec = IncrementalDecoder::new(prompt.len());
        let mut out = String::new();
        for &t in &generated {
            ids.push(t);
            let d = dec.step(&tok, &ids);
            assert!(
                !d.contains('\u{FFFD}'),
                "{text:?}: delta {d:?} holds a broken character"
            );
            out.push_str(&d);
        }
        assert_eq!(out, text);
    }
}

#[test]
fn byte_level_chars_are_gpt2s_map() {
    let c = wllm::tokenizer::byte_level_chars();
    assert_eq!((c[b' ' as usize], c[b'\n' as usize], c[b'a' as usize]), ('Ġ', 'Ċ', 'a'));
    assert_eq!((c[0], c[0xad], c[0xff]), ('\u{100}', '\u{143}', 'ÿ'));
    let distinct: std::collections::HashSet<char> = c.iter().copied().collect();
    assert_eq!(distinct.len(), 256);
}

/// Token ids of every text of tests/data/tokenize-texts.json equal llama.cpp's
/// `llama-tokenize` for the model (scripts/tokenize-ref.py wrote the reference).
fn matches_llama_tokenize(model: &std::path::Path, reference: &str) {
    assert!(
        model.exists(),
        "{} is missing: run ./models/fetch-gemma3.sh and ./models/fetch-vocabs.sh (the README's test command does)",
        model.display()
    );
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(reference);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("reference")).expect("JSON");
    let files = ModelFiles::open(model).expect("open");
    let ModelFiles::Gguf { file, .. } = &files else {
        unreachable!()
    };
    let tok = Tokenizer::from_gguf(file).expect("tokenizer");
    let cases = r["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let mut bad = Vec::new();
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).expect("ids");
        let got = tok.encode(text).expect("encode");
        if got != want {
            bad.push(format!("{text:?}:\n  wllm      {got:?}\n  llama.cpp {want:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} texts differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn gemma3_sentencepiece_ids_equal_llama_cpp() {
    matches_llama_tokenize(&gemma3_path(), "tokenize-gemma3.json");
}

#[test]
fn default_model_ids_equal_llama_cpp() {
    matches_llama_tokenize(&default_model_path(), "tokenize-smollm2.json");
}

/// Decoding a SentencePiece encoding gives the text back (spaces, bytes, specials).
#[test]
fn gemma3_decodes_what_it_encodes() {
    let files = ModelFiles::open(&gemma3_path()).expect("open");
    let ModelFiles::Gguf { file, .. } = &files else {
        unreachable!()
    };
    let tok = Tokenizer::from_gguf(file).expect("tokenizer");
    for text in [
        "  two leading, three trailing   ",
        "中文 🙂 𝔘 \u{1}",
        "<start_of_turn>user\nHi<end_of_turn>",
    ] {
        let ids = tok.encode_plain(text).expect("encode");
        assert_eq!(tok.decode(&ids), text);
    }
    assert!(tok.add_bos && tok.bos_id == Some(2));
    assert!(
        tok.eos_ids.contains(&1) && tok.eos_ids.contains(&106),
        "{:?}",
        tok.eos_ids
    );
}

/// llama.cpp's vocabulary-only fixtures (models/fetch-vocabs.sh).
fn vocab_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("models/vocab/ggml-vocab-{name}.gguf"))
}

/// The fixture's own cases: llama.cpp's test texts (.inp, split at
/// `__ggml_vocab_test__`) and their ids (.out, one line a text; no BOS, special
/// tokens not parsed — as its test-tokenizer-0 runs them).
fn matches_llama_cpp_fixture(name: &str) {
    let p = vocab_path(name);
    let read = |ext: &str| {
        let f = format!("{}{ext}", p.display());
        std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{f}: {e} (run ./models/fetch-vocabs.sh)"))
    };
    let inp = read(".inp");
    // Each text is followed by the marker line.
    let texts: Vec<&str> = inp.split_terminator("\n__ggml_vocab_test__\n").collect();
    let out = read(".out");
    let want: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().expect("id")).collect())
        .collect();
    assert_eq!(texts.len(), want.len(), "{name}: texts and id lines");
    let files = ModelFiles::open(&p).expect("open");
    let ModelFiles::Gguf { file, .. } = &files else {
        unreachable!()
    };
    let tok = Tokenizer::from_gguf(file).expect("tokenizer");
    let mut bad = Vec::new();
    for (text, want) in texts.iter().zip(&want) {
        // The fixtures hold no special tokens, so parsing them changes nothing.
        let got = tok.encode_plain(text).expect("encode");
        if &got != want {
            bad.push(format!("{text:?}:\n  wllm      {got:?}\n  llama.cpp {want:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} texts differ:\n{}",
        bad.len(),
        texts.len(),
        bad.join("\n")
    );
}

#[test]
fn qwen2_bpe_ids_equal_llama_cpp() {
    matches_llama_tokenize(&vocab_path("qwen2"), "tokenize-qwen2.json");
    matches_llama_cpp_fixture("qwen2");
}

#[test]
fn llama_sentencepiece_ids_equal_llama_cpp() {
    matches_llama_tokenize(&vocab_path("llama-spm"), "tokenize-llama-spm.json");
    matches_llama_cpp_fixture("llama-spm");
}

#[test]
fn phi3_sentencepiece_ids_equal_llama_cpp() {
    matches_llama_tokenize(&vocab_path("phi-3"), "tokenize-phi-3.json");
    matches_llama_cpp_fixture("phi-3");
}
