//! Structured output: a request's constraint (JSON schema, any JSON object,
//! regex, a choice among strings, a Lark grammar) compiled by llguidance into
//! a matcher that gives, before each token, the set of tokens that keep the
//! output inside the constraint. `Guide` holds the tokenizer's token trie and
//! the parser factory, built once per model on first use and shared by every
//! request; a constraint that cannot compile is an error at request time.

use std::sync::{Arc, OnceLock};

pub use llguidance::Matcher;
use llguidance::ParserFactory;
use llguidance::api::TopLevelGrammar;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// A JSON value valid against this JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// The whole output matches this regular expression.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Grammar(String),
}

/// A constraint that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid constraint: {0}")]
pub struct ConstraintError(pub String);

impl Constraint {
    fn grammar(&self) -> Result<TopLevelGrammar, ConstraintError> {
        Ok(match self {
            Constraint::JsonSchema(s) => {
                let s = match s {
                    serde_json::Value::Bool(true) => serde_json::json!({}),
                    serde_json::Value::Object(_) => s.clone(),
                    _ => return Err(ConstraintError("a JSON schema must be an object".into())),
                };
                TopLevelGrammar::from_json_schema(compact(s))
            }
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Choice(c) => {
                if c.is_empty() || c.iter().any(String::is_empty) {
                    return Err(ConstraintError("a choice needs at least one non-empty string".into()));
                }
                let alts: Vec<String> = c.iter().map(|s| regex_syntax_escape(s)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alts.join("|")))
            }
            Constraint::Grammar(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// JSON as `json.dumps` writes it (", " and ": ", no other whitespace) unless
/// the schema sets llguidance's own `x-guidance` options: with free whitespace
/// a small model can emit blank lines until its token budget runs out.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

fn regex_syntax_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~ \t\n".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The tokenizer as llguidance sees it: each token's bytes (special tokens
/// behind toktrie's marker), and tokenisation of byte strings.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok
            .encode_fragment(&String::from_utf8_lossy(s))
            .unwrap_or_default()
    }
}

/// The token trie and parser factory of one tokenizer, built on first use.
pub struct Guide {
    tok: Arc<Tokenizer>,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
    /// Constraints compiled so far (`compiled`).
    compiled: std::sync::atomic::AtomicUsize,
}

impl Guide {
    pub fn new(tok: Arc<Tokenizer>) -> Self {
        Self {
            tok,
            factory: OnceLock::new(),
            compiled: Default::default(),
        }
    }

    /// How many constraints `matcher` has compiled (a request's is compiled
    /// once, however many sequences it has).
    pub fn compiled(&self) -> usize {
        self.compiled.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn build(tok: &Arc<Tokenizer>, vocab: usize) -> Result<Arc<ParserFactory>, String> {
        // Each token's bytes; special tokens behind toktrie's marker.
        let special = tok.special_token_ids();
        let mut bytes = Vec::with_capacity(vocab);
        for id in 0..vocab as u32 {
            match tok.token_bytes(id, &special)? {
                None => bytes.push(Vec::new()),
                Some(crate::tokenizer::TokenBytes::Special(s)) => {
                    let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    b.extend(s.as_bytes());
                    bytes.push(b);
                }
                Some(crate::tokenizer::TokenBytes::Text(b)) => bytes.push(b),
            }
        }
        let eos = tok
            .eos_ids
            .first()
            .copied()
            .ok_or("the tokenizer has no end-of-sequence token")?;
        let mut info = TokRxInfo::new(vocab as u32, eos);
        info.tok_bos = tok.bos_id;
        let trie = TokTrie::from(&info, &bytes);
        let env: TokEnv = Arc::new(Env { trie, tok: tok.clone() });
        let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        f.quiet();
        Ok(Arc::new(f))
    }

    /// A fresh matcher for `c` over a vocabulary of `vocab` (the model's).
    pub fn matcher(&self, c: &Constraint, vocab: usize) -> Result<Matcher, ConstraintError> {
        self.compiled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = self
            .factory
            .get_or_init(|| Self::build(&self.tok, vocab))
            .as_ref()
            .map_err(|e| ConstraintError(e.clone()))?;
        let parser = f
            .create_parser(c.grammar()?)
            .map_err(|e| ConstraintError(e.to_string()))?;
        let m = Matcher::new(Ok(parser));
        match m.get_error() {
            Some(e) => Err(ConstraintError(e)),
            None => Ok(m),
        }
    }
}

/// Sets every logit a matcher's mask forbids to −∞; returns whether any token is allowed.
pub fn apply_mask(mask: anyhow::Result<toktrie::SimpleVob>, logits: &mut [f32]) -> Result<bool, ConstraintError> {
    let mask = mask.map_err(|e| ConstraintError(e.to_string()))?;
    let mut any = false;
    for (t, l) in logits.iter_mut().enumerate() {
        if mask.is_allowed(t as TokenId) {
            any = true;
        } else {
            *l = f32::NEG_INFINITY;
        }
    }
    Ok(any)
}
