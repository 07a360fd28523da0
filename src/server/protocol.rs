//! OpenAI-compatible request and response bodies (completions, chat
//! completions, models, errors), with vLLM's extra sampling fields.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sampling::SamplingOverrides;

/// `prompt`: a string, a list of strings, token ids, or a list of token-id lists.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by both endpoints: the sampling parameters (the same list as
/// `SamplingParams` and the CLI's flags, vLLM's extras included) and these.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    #[serde(flatten)]
    pub sampling: SamplingOverrides,
    pub n: Option<usize>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Ollama's `keep_alive` for a model loaded on demand: how long it stays
    /// loaded after this request (seconds, or "30s", "5m", "1h"; 0: unload
    /// when done; negative: never unload).
    #[serde(default, deserialize_with = "keep_alive")]
    pub keep_alive: Option<std::time::Duration>,
}

/// The longest `keep_alive` a request may give (a negative one means "never unload").
pub const MAX_KEEP_ALIVE_SECS: f64 = 366.0 * 24.0 * 3600.0;

/// Ollama's `keep_alive`: a number of seconds or a duration string (Go's
/// form: "90", "30s", "5m", "1h30m", "250ms"); negative: forever. At most
/// a year (`MAX_KEEP_ALIVE_SECS`); anything else is refused with what to give.
pub fn keep_alive<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<std::time::Duration>, D::Error> {
    use serde::de::Error;
    let secs = match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| D::Error::custom("keep_alive: not a number"))?,
        Some(Value::String(s)) => parse_duration(&s).map_err(D::Error::custom)?,
        Some(v) => {
            return Err(D::Error::custom(format!(
                "keep_alive must be a number or a string, got {v}"
            )));
        }
    };
    keep_alive_of(secs).map(Some).map_err(D::Error::custom)
}

/// A `keep_alive` of `secs` seconds, checked.
pub fn keep_alive_of(secs: f64) -> Result<std::time::Duration, String> {
    if secs.is_nan() {
        return Err("keep_alive is not a number".into());
    }
    if secs < 0.0 {
        return Ok(std::time::Duration::MAX);
    }
    if secs > MAX_KEEP_ALIVE_SECS {
        return Err(format!(
            "keep_alive may be at most {MAX_KEEP_ALIVE_SECS} seconds (a year), got {secs}; a negative value keeps \
             the model loaded for ever"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Seconds of a Go-style duration string ("1h30m", "-1", "2.5s"; a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<f64, String> {
    let bad = || format!("keep_alive {s:?} is not a duration: use seconds, or numbers with ms, s, m or h (1h30m)");
    let t = s.trim();
    let (sign, rest) = match t.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, t.strip_prefix('+').unwrap_or(t)),
    };
    if rest.is_empty() || rest.len() > 64 {
        return Err(bad());
    }
    if let Ok(v) = rest.parse::<f64>() {
        return if v.is_finite() { Ok(sign * v) } else { Err(bad()) };
    }
    let mut total = 0.0;
    let mut r = rest;
    while !r.is_empty() {
        let num_end = r.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let unit_end = r[num_end..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(r.len(), |i| num_end + i);
        let v: f64 = r[..num_end].parse().map_err(|_| bad())?;
        let mult = match &r[num_end..unit_end] {
            "ns" => 1e-9,
            "us" | "\u{b5}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += v * mult;
        r = &r[unit_end..];
    }
    Ok(sign * total)
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    /// Top-n logprobs per token (legacy completions API).
    pub logprobs: Option<usize>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// A chat message's content: a string or a list of typed parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ContentInput {
    Text(String),
    Parts(Vec<Value>),
    Null,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default = "null_content")]
    pub content: ContentInput,
    /// An assistant turn's tool calls (OpenAI's shape).
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
}

fn null_content() -> ContentInput {
    ContentInput::Null
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    pub max_completion_tokens: Option<usize>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// OpenAI's error object.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Clone, Debug, Serialize)]
pub struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_takes_ollamas_durations_and_refuses_the_rest() {
        let ka = |v: Value| -> Result<Option<std::time::Duration>, String> {
            keep_alive(v).map_err(|e: serde_json::Error| e.to_string())
        };
        let secs = |v: Value| ka(v).unwrap().unwrap().as_secs_f64();
        assert_eq!(secs(json_num(90.0)), 90.0);
        assert_eq!(secs(Value::from("5m")), 300.0);
        assert_eq!(secs(Value::from("1h30m")), 5400.0);
        assert_eq!(secs(Value::from("250ms")), 0.25);
        assert_eq!(secs(Value::from("0")), 0.0);
        assert_eq!(ka(Value::from(-1)).unwrap(), Some(std::time::Duration::MAX));
        assert_eq!(ka(Value::from("-1m")).unwrap(), Some(std::time::Duration::MAX));
        assert_eq!(ka(Value::Null).unwrap(), None);
        // Once a panic in Duration::from_secs_f64 (row 4 of the hostile-input review).
        for bad in [
            json_num(1e20),
            Value::from("1e20"),
            Value::from("inf"),
            Value::from("nan"),
            Value::from("5x"),
            Value::from(""),
            Value::from("h"),
            Value::from("9999999h"),
            Value::from(vec![1]),
        ] {
            assert!(ka(bad.clone()).is_err(), "{bad}");
        }
    }

    fn json_num(v: f64) -> Value {
        serde_json::Number::from_f64(v).map(Value::Number).unwrap()
    }
}
