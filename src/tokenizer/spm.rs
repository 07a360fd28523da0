//! SentencePiece vocabularies from GGUF metadata (`tokenizer.ggml.model =
//! "llama"`: Llama 2, Mistral, TinyLlama, Gemma, Phi-3), tokenised exactly as
//! llama.cpp's `llm_tokenizer_spm` does, so that token ids match its
//! `llama-tokenize`:
//! - special tokens (control, user-defined, unknown) are split out of the text
//!   first, longest first, each occurrence where it stands;
//! - each text piece gets a leading space when the vocabulary asks for one
//!   (`add_space_prefix`) and it follows a special token or starts the text,
//!   and its spaces become U+2581 ('▁');
//! - its characters are merged pairwise, the pair whose joined text is the
//!   vocabulary token of highest score first (ties: the leftmost), while any
//!   pair forms a token;
//! - a piece that is no token is split back into the pairs it was merged from,
//!   and what is still no token falls back to its bytes (`<0xXX>` tokens).
//!
//! Decoding turns '▁' back into spaces and byte tokens into their bytes.

use std::collections::{BinaryHeap, HashMap};

use crate::model::gguf::{GgufFile, Value};

/// GGUF token types.
const NORMAL: u8 = 1;
const UNKNOWN: u8 = 2;
const CONTROL: u8 = 3;
const USER_DEFINED: u8 = 4;
const BYTE: u8 = 6;

/// A SentencePiece vocabulary.
pub struct SpmVocab {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<u8>,
    to_id: HashMap<String, u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    /// Special tokens that swallow the whitespace after them (llama.cpp's RSTRIP, Phi-3's).
    rstrip: Vec<bool>,
    pub add_space_prefix: bool,
    byte_ids: [Option<u32>; 256],
}

/// One bigram candidate: merge symbols `left` and `right` into a token of `score`.
#[derive(PartialEq)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Highest score first; on equal scores, the leftmost.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// A symbol of the merge: bytes `start..start + n` of the text, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A piece of the input: text, or a special token already recognised.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl SpmVocab {
    /// Reads `tokenizer.ggml.{tokens, scores, token_type, add_space_prefix}`.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, String> {
        let arr = |k: &str| {
            g.get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("GGUF lacks {k}"))
        };
        let tokens: Vec<String> = arr("tokenizer.ggml.tokens")?
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect();
        let scores: Vec<f32> = match g.get("tokenizer.ggml.scores").and_then(Value::numbers) {
            Some(a) => a.iter().map(|&v| v as f32).collect(),
            None => vec![0.0; tokens.len()],
        };
        let types: Vec<u8> = match g.get("tokenizer.ggml.token_type").and_then(Value::numbers) {
            Some(a) => a
                .iter()
                .map(|&v| if (0.0..256.0).contains(&v) { v as u8 } else { 1 })
                .collect(),
            None => vec![NORMAL; tokens.len()],
        };
        if scores.len() != tokens.len() || types.len() != tokens.len() {
            return Err(format!(
                "{} tokens but {} scores and {} token types",
                tokens.len(),
                scores.len(),
                types.len()
            ));
        }
        let mut to_id = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            to_id.entry(t.clone()).or_insert(i as u32);
        }
        let mut specials: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| matches!(types[i as usize], CONTROL | USER_DEFINED | UNKNOWN))
            .filter(|&i| !tokens[i as usize].is_empty())
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        // llama.cpp: Phi-3's special tokens strip the whitespace after them
        // (but <unk>, <s> and <|endoftext|>), and so does its "</s>".
        let name = g
            .get("general.name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_lowercase();
        let phi3 = name.contains("phi-3") || name.contains("phi3");
        let rstrip = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                phi3 && (matches!(types[i], CONTROL | USER_DEFINED | UNKNOWN) || t == "</s>")
                    && !matches!(t.as_str(), "<unk>" | "<s>" | "<|endoftext|>")
            })
            .collect();
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = to_id
                .get(&format!("<0x{b:02X}>"))
                .or_else(|| {
                    char::from_u32(b as u32)
                        .filter(|_| b < 128)
                        .and_then(|c| to_id.get(&c.to_string()))
                })
                .copied();
        }
        Ok(Self {
            add_space_prefix: g
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            tokens,
            scores,
            types,
            to_id,
            specials,
            rstrip,
            byte_ids,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.to_id.get(text).copied()
    }

    /// Whether a token is a control token (its text is markup, not output).
    pub fn is_control(&self, id: u32) -> bool {
        matches!(self.types.get(id as usize), Some(&(CONTROL | UNKNOWN)))
    }

    /// Token ids of `text` (no BOS); special tokens are recognised in the text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, self.add_space_prefix)
    }

    /// `encode`, with the space prefix or without it (a fragment in the middle
    /// of a text, as structured output tokenises them).
    pub fn encode_with(&self, text: &str, add_space_prefix: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let mut prev_special = true;
        for f in self.partition(text) {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut s = String::with_capacity(t.len() + 3);
                    if add_space_prefix && prev_special {
                        s.push(' ');
                    }
                    s.push_str(t);
                    self.tokenize_piece(&s.replace(' ', "\u{2581}"), &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    /// Splits special tokens out of the text, longest first (llama.cpp's
    /// `tokenizer_st_partition`).
    fn partition<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.specials {
            let pat = self.tokens[id as usize].as_str();
            if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(pat))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut t) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = t.find(pat) {
                    if at > 0 {
                        next.push(Fragment::Text(&t[..at]));
                    }
                    next.push(Fragment::Token(id));
                    t = &t[at + pat.len()..];
                    if self.rstrip[id as usize] {
                        t = t.trim_start_matches(|c: char| c.is_ascii_whitespace());
                    }
                }
                if !t.is_empty() {
                    next.push(Fragment::Text(t));
                }
            }
            frags = next;
        }
        frags
    }

    /// The merge of one escaped text piece into `out`.
    fn tokenize_piece<'t>(&self, text: &'t str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let n = c.len_utf8();
            symbols.push(Symbol {
                start,
                n,
                prev: i.checked_sub(1),
                next: (start + n < text.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let mut rev_merge: HashMap<&'t str, (usize, usize)> = HashMap::new();
        let try_add = |l: Option<usize>,
                       r: Option<usize>,
                       symbols: &[Symbol],
                       queue: &mut BinaryHeap<Bigram>,
                       rev: &mut HashMap<&'t str, (usize, usize)>| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let (a, b) = (symbols[l], symbols[r]);
            let piece = &text[a.start..a.start + a.n + b.n];
            let Some(&id) = self.to_id.get(piece) else { return };
            queue.push(Bigram {
                left: l,
                right: r,
                score: self.scores[id as usize],
                size: piece.len(),
            });
            rev.insert(piece, (l, r));
        };
        for i in 1..symbols.len() {
            try_add(Some(i - 1), Some(i), &symbols, &mut queue, &mut rev_merge);
        }
        while let Some(bg) = queue.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            if l.n == 0 || r.n == 0 || l.n + r.n != bg.size {
                continue;
            }
            symbols[bg.left].n += r.n;
            symbols[bg.right].n = 0;
            symbols[bg.left].next = r.next;
            if let Some(nx) = r.next {
                symbols[nx].prev = Some(bg.left);
            }
            let left = symbols[bg.left];
            try_add(left.prev, Some(bg.left), &symbols, &mut queue, &mut rev_merge);
            try_add(Some(bg.left), left.next, &symbols, &mut queue, &mut rev_merge);
        }
        let mut i = (!symbols.is_empty()).then_some(0);
        while let Some(s) = i {
            self.resegment(text, &symbols, &rev_merge, s, symbols[s].n, out);
            i = symbols[s].next;
        }
    }

    /// Symbol `s` (of `n` bytes) as tokens: itself, the pair it was merged from, or its bytes.
    fn resegment(
        &self,
        text: &str,
        symbols: &[Symbol],
        rev_merge: &HashMap<&str, (usize, usize)>,
        s: usize,
        n: usize,
        out: &mut Vec<u32>,
    ) {
        let start = symbols[s].start;
        let piece = &text[start..start + n];
        if let Some(&id) = self.to_id.get(piece) {
            out.push(id);
            return;
        }
        match rev_merge.get(piece) {
            Some(&(l, r)) => {
                // The pair's sizes when it was merged: the left one ends where the right starts.
                let ln = symbols[r].start - symbols[l].start;
                self.resegment(text, symbols, rev_merge, l, ln, out);
                self.resegment(text, symbols, rev_merge, r, n - ln, out);
            }
            None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
        }
    }

    /// The bytes a token stands for (llama.cpp's `token_to_piece` with special tokens shown).
    pub fn piece(&self, id: u32) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        match self.types[id as usize] {
            BYTE => match u8::from_str_radix(t.get(3..5).unwrap_or(""), 16) {
                Ok(b) => vec![b],
                Err(_) => t.as_bytes().to_vec(),
            },
            NORMAL => t.replace('\u{2581}', " ").into_bytes(),
            CONTROL | USER_DEFINED | UNKNOWN => t.as_bytes().to_vec(),
            _ => Vec::new(),
        }
    }

    /// Text of `ids`, bytes joined first (a character split over byte tokens stays whole).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.piece(i)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
