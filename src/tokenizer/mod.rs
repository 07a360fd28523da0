//! Tokenizer: byte-level BPE (the `tokenizers` crate) from tokenizer.json or
//! GGUF metadata, or a GGUF SentencePiece vocabulary (`spm`, llama.cpp's
//! algorithm); the chat template (minijinja); and incremental detokenisation
//! that never emits half a UTF-8 character.

pub mod spm;

use std::path::Path;

use spm::SpmVocab;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::model::gguf::{GgufFile, Value};

/// Tokenizer errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer: {0}")]
    Build(String),
    #[error("tokenizer: cannot encode: {0}")]
    Encode(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("this model has no chat template; run without --chat or use a model that has one")]
    NoTemplate,
    #[error(
        "chat template: the render ran past its budget of {TEMPLATE_FUEL} instructions (the model's template \
         loops too long for these messages); shorten the conversation or fix the template"
    )]
    TemplateOutOfFuel,
    #[error("chat template: the rendered prompt passed {0} bytes, more than the model's context can hold")]
    TemplateTooLarge(usize),
    #[error(
        "the prompt is {bytes} bytes, more than the {cap} bytes that can fit the model's context \
         (max model len {max_model_len} tokens x {longest} bytes, the longest token, x 4): shorten it"
    )]
    PromptTooLarge {
        bytes: usize,
        cap: usize,
        max_model_len: usize,
        longest: usize,
    },
}

/// One chat message.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The vocabulary and algorithm behind a `Tokenizer`.
enum Inner {
    Hf(Box<tokenizers::Tokenizer>),
    Spm(Box<SpmVocab>),
}

/// What a token stands for, as structured output needs it.
pub enum TokenBytes {
    /// A control token: its text, never produced by a grammar's text.
    Special(String),
    /// The bytes the token adds to the output.
    Text(Vec<u8>),
}

/// Text ↔ token ids for one model.
pub struct Tokenizer {
    inner: Inner,
    pub bos_id: Option<u32>,
    pub add_bos: bool,
    /// Tokens that end generation (EOS and any others the model declares).
    pub eos_ids: Vec<u32>,
    pub chat_template: Option<String>,
    bos_token: String,
    eos_token: String,
    /// Bytes of the longest token's text (`longest_token_bytes`), found on first use.
    longest: std::sync::OnceLock<usize>,
}

/// Llama 3's pre-tokenizer split (llama.cpp's "llama-bpe").
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's pre-tokenizer split (llama.cpp's "qwen2"): Llama 3's with digits one at a time.
pub const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn build_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

impl Tokenizer {
    /// Builds the GPT-2 style BPE tokenizer that GGUF metadata describes.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, TokenizerError> {
        let s = |k: &str| g.get(k).and_then(Value::as_str).map(String::from);
        let u = |k: &str| g.get(k).and_then(Value::as_u64).map(|v| v as u32);
        let model = s("tokenizer.ggml.model").unwrap_or_default();
        if model == "llama" {
            return Self::from_gguf_spm(g);
        }
        if model != "gpt2" {
            return Err(TokenizerError::Build(format!(
                "GGUF tokenizer model {model:?} is not supported (BPE \"gpt2\" and SentencePiece \"llama\" are); \
                 load the Hugging Face directory with its tokenizer.json instead"
            )));
        }
        let arr = |k: &str| {
            g.get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| build_err(format!("GGUF lacks {k}")))
        };
        let tokens: Vec<String> = arr("tokenizer.ggml.tokens")?
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect();
        let types: Vec<u64> = match g.get("tokenizer.ggml.token_type").and_then(Value::numbers) {
            Some(a) => a.iter().map(|&v| if v >= 0.0 { v as u64 } else { 1 }).collect(),
            None => vec![1; tokens.len()],
        };
        let merges: Vec<(String, String)> = arr("tokenizer.ggml.merges")?
            .iter()
            .filter_map(|v| v.as_str())
            .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
            .collect();
        let vocab: tokenizers::models::bpe::Vocab =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(build_err)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, false, true);
        let pre = s("tokenizer.ggml.pre").unwrap_or_else(|| "default".into());
        let regex_split = |re: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
            let split = Split::new(SplitPattern::Regex(re.into()), SplitDelimiterBehavior::Isolated, false)
                .map_err(build_err)?;
            Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]).into())
        };
        let pre_tok: PreTokenizerWrapper = match pre.as_str() {
            "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
            "llama-bpe" | "llama3" | "smaug-bpe" => regex_split(LLAMA3_REGEX)?,
            "qwen2" | "deepseek-r1-qwen" => regex_split(QWEN2_REGEX)?,
            "default" | "gpt-2" | "gpt2" => byte_level.into(),
            other => {
                return Err(TokenizerError::Build(format!(
                    "GGUF pre-tokenizer {other:?} (tokenizer.ggml.pre) is not supported: wllm splits text as \
                     \"default\", \"gpt-2\", \"smollm\", \"llama-bpe\" and \"qwen2\" do; a different split \
                     would give other token ids than the model was trained on"
                )));
            }
        };
        inner.with_pre_tokenizer(Some(pre_tok));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let mut added = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            match types.get(i) {
                Some(3) => added.push(AddedToken::from(t.clone(), true)),
                Some(4) => added.push(AddedToken::from(t.clone(), false)),
                _ => {}
            }
        }
        inner.add_special_tokens(&added);
        let bos_id = u("tokenizer.ggml.bos_token_id");
        let eos_id = u("tokenizer.ggml.eos_token_id");
        let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
        if let Some(e) = u("tokenizer.ggml.eot_token_id").filter(|e| !eos_ids.contains(e)) {
            eos_ids.push(e);
        }
        let name = |id: Option<u32>| id.and_then(|i| tokens.get(i as usize).cloned()).unwrap_or_default();
        Ok(Self {
            inner: Inner::Hf(Box::new(inner)),
            bos_id,
            add_bos: g
                .get("tokenizer.ggml.add_bos_token")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            eos_ids,
            chat_template: s("tokenizer.chat_template"),
            bos_token: name(bos_id),
            eos_token: name(eos_id),
            longest: Default::default(),
        })
    }

    /// Loads tokenizer.json, tokenizer_config.json and generation_config.json of a directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        // The tokenizers crate panics on some malformed files (found by
        // tests/fuzz_tests.rs); a bad file must be an error, never a crash.
        let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tokenizers::Tokenizer::from_file(&path)))
            .map_err(|_| build_err(format!("{}: malformed tokenizer file", path.display())))?;
        let inner = parsed.map_err(|e| build_err(format!("{}: {e}", path.display())))?;
        let read_json = |f: &str| -> serde_json::Value {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default()
        };
        let tc = read_json("tokenizer_config.json");
        let gc = read_json("generation_config.json");
        let tok_str = |v: &serde_json::Value| -> Option<String> {
            v.as_str()
                .map(String::from)
                .or_else(|| v["content"].as_str().map(String::from))
        };
        let bos_token = tok_str(&tc["bos_token"]).unwrap_or_default();
        let eos_token = tok_str(&tc["eos_token"]).unwrap_or_default();
        let mut eos_ids: Vec<u32> = match &gc["eos_token_id"] {
            serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_u64().map(|x| x as u32)).collect(),
            v => v.as_u64().map(|x| x as u32).into_iter().collect(),
        };
        if let Some(id) = inner.token_to_id(&eos_token).filter(|id| !eos_ids.contains(id)) {
            eos_ids.push(id);
        }
        let bos_id = inner.token_to_id(&bos_token);
        Ok(Self {
            add_bos: tc["add_bos_token"].as_bool().unwrap_or(false) && bos_id.is_some(),
            bos_id,
            eos_ids,
            chat_template: tc["chat_template"].as_str().map(String::from),
            bos_token,
            eos_token,
            inner: Inner::Hf(Box::new(inner)),
            longest: Default::default(),
        })
    }

    /// A GGUF SentencePiece vocabulary (`spm`): BOS added unless the file
    /// says not to (llama.cpp's default for SPM), EOS and EOT end generation.
    fn from_gguf_spm(g: &GgufFile) -> Result<Self, TokenizerError> {
        let u = |k: &str| g.get(k).and_then(Value::as_u64).map(|v| v as u32);
        let vocab = SpmVocab::from_gguf(g).map_err(build_err)?;
        let bos_id = u("tokenizer.ggml.bos_token_id").or_else(|| vocab.id("<s>"));
        let eos_id = u("tokenizer.ggml.eos_token_id").or_else(|| vocab.id("</s>"));
        let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
        // End-of-turn tokens the file names, and the chat markers llama.cpp treats as such.
        let eot = u("tokenizer.ggml.eot_token_id").into_iter().chain(
            ["<end_of_turn>", "<|end|>", "<|eot_id|>", "<|im_end|>"]
                .iter()
                .filter_map(|t| vocab.id(t)),
        );
        for e in eot {
            if !eos_ids.contains(&e) {
                eos_ids.push(e);
            }
        }
        let name = |id: Option<u32>| id.and_then(|i| vocab.token(i)).unwrap_or_default().to_string();
        Ok(Self {
            longest: Default::default(),
            bos_token: name(bos_id),
            eos_token: name(eos_id),
            add_bos: g
                .get("tokenizer.ggml.add_bos_token")
                .and_then(Value::as_bool)
                .unwrap_or(true)
                && bos_id.is_some(),
            bos_id,
            eos_ids,
            chat_template: g
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(|| builtin_template(g)),
            inner: Inner::Spm(Box::new(vocab)),
        })
    }

    /// Token ids of `text`, special tokens parsed, BOS added when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let plain = self.encode_plain(text)?;
        let mut ids = Vec::with_capacity(plain.len() + 1);
        if self.add_bos
            && let Some(b) = self.bos_id
        {
            ids.push(b);
        }
        ids.extend(plain);
        Ok(ids)
    }

    /// Token ids of a rendered chat template: as `encode`, but no second BOS
    /// where the template wrote one itself (Gemma's, Llama 2's).
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if self.add_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            return self.encode_plain(text);
        }
        self.encode(text)
    }

    /// Text of `ids` (special tokens included).
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.inner {
            Inner::Hf(t) => t.decode(ids, false).unwrap_or_default(),
            Inner::Spm(v) => v.decode(ids),
        }
    }

    /// Bytes of the longest token as the vocabulary spells it (at least 1):
    /// no token stands for more text than this, so a text of B bytes has at
    /// least B / this many tokens (a normaliser that lengthens text aside).
    pub fn longest_token_bytes(&self) -> usize {
        *self.longest.get_or_init(|| {
            // The text a token stands for (a byte-level "Ġ" is one byte of
            // text, a control token its spelling); where that is not known,
            // the token's spelling, which is never shorter.
            let special = self.special_token_ids();
            (0..self.vocab_size() as u32)
                .filter_map(|id| match self.token_bytes(id, &special) {
                    Ok(Some(TokenBytes::Text(b))) => Some(b.len()),
                    Ok(Some(TokenBytes::Special(s))) => Some(s.len()),
                    Ok(None) => None,
                    Err(_) => self.id_to_token(id).map(|t| t.len()),
                })
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    /// The most bytes of prompt text worth tokenizing for a context of
    /// `max_model_len` tokens: 4 × `max_model_len` × the longest token
    /// (the 4 leaves room for normalisers that lengthen text, NFKC's
    /// ligatures say); anything longer cannot fit and is refused unread.
    pub fn max_prompt_bytes(&self, max_model_len: usize) -> usize {
        max_model_len
            .saturating_mul(self.longest_token_bytes())
            .saturating_mul(4)
    }

    /// `Err` where a prompt text of `bytes` is over `max_prompt_bytes`.
    pub fn check_prompt_bytes(&self, bytes: usize, max_model_len: usize) -> Result<(), TokenizerError> {
        let cap = self.max_prompt_bytes(max_model_len);
        if bytes > cap {
            return Err(TokenizerError::PromptTooLarge {
                bytes,
                cap,
                max_model_len,
                longest: self.longest_token_bytes(),
            });
        }
        Ok(())
    }

    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Hf(t) => t.get_vocab_size(true),
            Inner::Spm(v) => v.len(),
        }
    }

    /// Writes the tokenizer as a Hugging Face tokenizer.json (byte-level BPE only).
    pub fn save_json(&self, path: &Path) -> Result<(), TokenizerError> {
        match &self.inner {
            Inner::Hf(t) => t.save(path, false).map_err(build_err),
            Inner::Spm(_) => Err(build_err(
                "a SentencePiece vocabulary cannot be written as tokenizer.json",
            )),
        }
    }

    /// The BOS and EOS token strings.
    pub fn special_token_strings(&self) -> (&str, &str) {
        (&self.bos_token, &self.eos_token)
    }

    /// Token ids of `text` without BOS (special tokens parsed).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner {
            Inner::Hf(t) => {
                let enc = t
                    .encode(text, false)
                    .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                Ok(enc.get_ids().to_vec())
            }
            Inner::Spm(v) => Ok(v.encode(text)),
        }
    }

    /// Token ids of a piece from the middle of a text: `encode_plain` without
    /// SentencePiece's space prefix (what structured output asks for).
    pub fn encode_fragment(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner {
            Inner::Spm(v) => Ok(v.encode_with(text, false)),
            Inner::Hf(_) => self.encode_plain(text),
        }
    }

    /// Ids of the tokens marked special (control tokens).
    pub fn special_token_ids(&self) -> std::collections::HashSet<u32> {
        match &self.inner {
            Inner::Hf(t) => t
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, t)| t.special)
                .map(|(id, _)| id)
                .collect(),
            Inner::Spm(v) => (0..v.len() as u32).filter(|&i| v.is_control(i)).collect(),
        }
    }

    /// The string a token id stands for, if any.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Hf(t) => t.id_to_token(id),
            Inner::Spm(v) => v.token(id).map(String::from),
        }
    }

    /// What token `id` stands for as bytes of output (None: no such token);
    /// an error for a vocabulary whose tokens are not byte-level. `special`:
    /// `special_token_ids()` (control tokens), computed once by the caller;
    /// every other token, user-defined ones included, is the text it adds.
    pub fn token_bytes(&self, id: u32, special: &std::collections::HashSet<u32>) -> Result<Option<TokenBytes>, String> {
        let Some(s) = self.id_to_token(id) else {
            return Ok(None);
        };
        if special.contains(&id) {
            return Ok(Some(TokenBytes::Special(s)));
        }
        match &self.inner {
            Inner::Spm(v) => Ok(Some(TokenBytes::Text(v.piece(id)))),
            Inner::Hf(_) => {
                let dec = byte_level_decoder();
                let b: Option<Vec<u8>> = s.chars().map(|c| dec.get(&c).copied()).collect();
                match b {
                    Some(b) => Ok(Some(TokenBytes::Text(b))),
                    None => Err(format!(
                        "token {id} ({s:?}) is not byte-level BPE: structured output needs byte-level BPE \
                         or a GGUF SentencePiece vocabulary"
                    )),
                }
            }
        }
    }

    /// Renders the chat template for `messages` with the generation prompt added.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        self.apply_chat_template_with_tools(messages, None)
    }

    /// As `apply_chat_template`, with OpenAI-style `tools` for templates that render them.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_capped(messages, tools, usize::MAX)
    }

    /// As `apply_chat_template_with_tools`, refusing a render that runs out
    /// of fuel (`TEMPLATE_FUEL` instructions) or writes more than `max_bytes`.
    pub fn apply_chat_template_capped(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        max_bytes: usize,
    ) -> Result<String, TokenizerError> {
        let tpl = self.chat_template.as_ref().ok_or(TokenizerError::NoTemplate)?;
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template("chat", tpl)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let t = env
            .get_template("chat")
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let mut out = CappedWriter {
            bytes: Vec::new(),
            cap: max_bytes,
            over: false,
        };
        let rendered = t.render_captured_to(
            minijinja::context! {
                messages => messages,
                tools => tools.map(minijinja::Value::from_serialize),
                add_generation_prompt => true,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            },
            &mut out,
        );
        match rendered {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|_| TokenizerError::Template("the rendered prompt is not UTF-8".into())),
            Err(_) if out.over => Err(TokenizerError::TemplateTooLarge(max_bytes)),
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => Err(TokenizerError::TemplateOutOfFuel),
            Err(e) => Err(TokenizerError::Template(e.to_string())),
        }
    }

    /// Why the model's own chat template cannot render a short two-message
    /// conversation within the render budget (`TEMPLATE_FUEL`, 1 MiB of
    /// output); `None` where it can (or where it fails for another reason, a
    /// template that checks roles, say, which requests meet on their own).
    pub fn template_budget_problem(&self) -> Option<String> {
        self.chat_template.as_ref()?;
        let m = [ChatMessage::new("user", "Hello!"), ChatMessage::new("assistant", "Hi.")];
        match self.apply_chat_template_capped(&m, None, 1 << 20) {
            Err(e @ (TokenizerError::TemplateOutOfFuel | TokenizerError::TemplateTooLarge(_))) => Some(e.to_string()),
            _ => None,
        }
    }
}

/// Instructions a chat template may run for one render (minijinja's fuel):
/// a long conversation with tools takes well under a tenth of it; a template
/// looping without end stops here, in tens of milliseconds.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// A render's output, refused past `cap` bytes (`over` then says so).
struct CappedWriter {
    bytes: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.cap - self.bytes.len() {
            self.over = true;
            self.bytes = Vec::new();
            return Err(std::io::Error::other("the rendered prompt is over its cap"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Gemma's turn format, for GGUF files that carry no template (as llama.cpp's
/// built-in "gemma" template: a system message opens the first user turn).
const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% set sys = namespace(text='') %}{% for m in messages %}\
{% if m.role == 'system' %}{% set sys.text = m.content + '\n\n' %}{% else %}<start_of_turn>\
{{ 'model' if m.role == 'assistant' else m.role }}\n{{ sys.text if m.role == 'user' else '' }}{{ m.content | trim }}\
<end_of_turn>\n{% if m.role == 'user' %}{% set sys.text = '' %}{% endif %}{% endif %}{% endfor %}\
{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

/// The chat template of a family whose GGUF files often lack one.
fn builtin_template(g: &GgufFile) -> Option<String> {
    let arch = g.get("general.architecture").and_then(Value::as_str)?;
    arch.starts_with("gemma").then(|| GEMMA_TEMPLATE.to_string())
}

/// Turns a growing list of token ids into text deltas, holding back bytes that do
/// not yet form whole UTF-8 characters (the prefix/read offset method).
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Starts after `prompt_len` prompt tokens that are never emitted.
    pub fn new(prompt_len: usize) -> Self {
        Self {
            prefix_offset: prompt_len.saturating_sub(5),
            read_offset: prompt_len,
        }
    }

    /// The new text once `ids` (all tokens so far) has grown; empty while a
    /// character is incomplete.
    pub fn step(&mut self, tok: &Tokenizer, ids: &[u32]) -> String {
        let prefix = tok.decode(&ids[self.prefix_offset..self.read_offset]);
        let full = tok.decode(&ids[self.prefix_offset..]);
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = ids.len();
            delta
        } else {
            String::new()
        }
    }
}

/// Byte-level BPE's stand-in characters, back to their bytes.
fn byte_level_decoder() -> &'static std::collections::HashMap<char, u8> {
    static DEC: std::sync::OnceLock<std::collections::HashMap<char, u8>> = std::sync::OnceLock::new();
    DEC.get_or_init(|| {
        byte_level_chars()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect()
    })
}

/// Byte-level BPE (GPT-2): the printable character that stands for each byte
/// in a token's string (printable ASCII and Latin-1 stand for themselves, the
/// rest map to U+0100 onwards).
pub fn byte_level_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        out[b as usize] = char::from_u32(c).unwrap_or('\u{fffd}');
    }
    out
}
