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
