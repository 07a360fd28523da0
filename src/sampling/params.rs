//! The sampling parameters, written once. `sampling_params!` below declares
//! each parameter a single time (name, type, library default, doc) and makes
//! from that list both `SamplingParams` (what the engine runs with) and
//! `SamplingOverrides` (every parameter optional), which is at once the CLI's
//! flags (`clap::Args`) and the fields of the server's request bodies
//! (`serde::Deserialize`), applied over a base with `apply`.

use serde::{Deserialize, Deserializer};

/// `SamplingParams::default().max_tokens`, as vLLM's.
pub const DEFAULT_MAX_TOKENS: usize = 16;

macro_rules! sampling_params {
    ($(
        $(#[doc = $doc:literal])*
        [$($attr:meta),*]
        $name:ident : $ty:ty = $default:expr, set $oty:ty => $wrap:expr;
    )*) => {
        /// How a request chooses its tokens and when it stops. The defaults are
        /// OpenAI's and vLLM's: temperature 1 and at most 16 tokens (a forgotten
        /// limit ends quickly instead of filling the context); `greedy()` is
        /// temperature 0. The CLI starts from greedy with no token limit.
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        pub struct SamplingParams {
            $( $(#[doc = $doc])* pub $name: $ty, )*
            /// Structured output: what the text must match (set from a request's
            /// `response_format` / `structured_outputs`, or `generate --json-schema`).
            #[serde(skip)]
            pub constraint: Option<super::constraint::Constraint>,
            /// An embedding request: the prompt's pooled hidden state comes
            /// back instead of generated tokens (`Engine::embed`).
            #[serde(skip)]
            pub embed: Option<crate::config::EmbedSpec>,
        }

        impl Default for SamplingParams {
            fn default() -> Self {
                Self { $( $name: $default, )* constraint: None, embed: None }
            }
        }

        /// Every sampling parameter, optional: what a request body or the command
        /// line sets over a base (`apply`). JSON `null` is the same as absent.
        #[derive(Clone, Debug, Default, PartialEq, Deserialize, clap::Args)]
        pub struct SamplingOverrides {
            $( $(#[doc = $doc])* $(#[$attr])* pub $name: Option<$oty>, )*
        }

        impl SamplingOverrides {
            /// `base` with every parameter given here replaced.
            pub fn apply(&self, mut base: SamplingParams) -> SamplingParams {
                $( if let Some(v) = &self.$name { base.$name = $wrap(v.clone()); } )*
                base
            }
        }
    };
}

fn same<T>(v: T) -> T {
    v
}

sampling_params! {
    /// Most tokens to generate (unset: up to the context length).
    [arg(long)]
    max_tokens: Option<usize> = Some(DEFAULT_MAX_TOKENS), set usize => Some;
    /// Sampling temperature; 0 is greedy.
    [arg(long)]
    temperature: f32 = 1.0, set f32 => same;
    /// Keep the k most likely tokens; 0 (or -1 in a request) disables.
    [arg(long), serde(default, deserialize_with = "de_top_k")]
    top_k: usize = 0, set usize => same;
    /// Keep the smallest set of tokens whose probability reaches p.
    [arg(long)]
    top_p: f32 = 1.0, set f32 => same;
    /// Drop tokens less likely than min_p times the most likely one.
    [arg(long)]
    min_p: f32 = 0.0, set f32 => same;
    /// HF-style: >1 discourages every token already in prompt or output.
    [arg(long)]
    repetition_penalty: f32 = 1.0, set f32 => same;
    /// OpenAI-style, on output tokens: minus this once per token present.
    [arg(long)]
    presence_penalty: f32 = 0.0, set f32 => same;
    /// OpenAI-style, on output tokens: minus this per occurrence.
    [arg(long)]
    frequency_penalty: f32 = 0.0, set f32 => same;
    /// Same seed, same tokens, whatever else is in the batch.
    [arg(long)]
    seed: Option<u64> = None, set u64 => Some;
    /// Stop strings (the text ends before the first one; repeat the flag for several).
    [arg(long), serde(default, deserialize_with = "one_or_many")]
    stop: Vec<String> = Vec::new(), set Vec<String> => same;
    /// Token ids that end the request (their text is not shown).
    [arg(long, value_delimiter = ',')]
    stop_token_ids: Vec<u32> = Vec::new(), set Vec<u32> => same;
    /// Keep generating past the end-of-sequence token.
    [arg(long, num_args = 0..=1, default_missing_value = "true")]
    ignore_eos: bool = false, set bool => same;
    /// Top-n logprobs per generated token (the chosen token's own logprob is
    /// always given when set). Each API spells it its own way, so requests and
    /// flags set it apart from the other parameters.
    [arg(skip), serde(skip)]
    logprobs: Option<usize> = None, set usize => Some;
    /// Speculative decoding for this request, over the engine's settings
    /// (`config::RequestSpeculation`; `{"num_speculative_tokens": 0}` turns it off).
    [arg(skip)]
    speculative_config: Option<crate::config::RequestSpeculation> = None, set crate::config::RequestSpeculation => Some;
}

/// vLLM's `top_k`: -1 (or 0) disables, a positive k keeps k tokens.
fn de_top_k<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    match Option::<i64>::deserialize(d)? {
        None | Some(-1) | Some(0) => Ok(None),
        Some(k) if k > 0 => Ok(Some(k as usize)),
        Some(k) => Err(serde::de::Error::custom(format!(
            "top_k must be -1 or positive, got {k}"
        ))),
    }
}

/// OpenAI's `stop`: one string or a list of them.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stop {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<Stop>::deserialize(d)? {
        None => None,
        Some(Stop::One(s)) => Some(vec![s]),
        Some(Stop::Many(v)) => Some(v),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_body_sets_what_it_names() {
        let o: SamplingOverrides = serde_json::from_str(
            r#"{"temperature": 0.5, "top_k": -1, "stop": "END", "seed": 7, "top_p": null, "max_tokens": 9}"#,
        )
        .unwrap();
        let p = o.apply(SamplingParams::default());
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.top_k, 0);
        assert_eq!(p.stop, ["END"]);
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.top_p, 1.0, "null keeps the base");
        assert_eq!(p.max_tokens, Some(9));
        let o: SamplingOverrides = serde_json::from_str(r#"{"stop": ["a", "b"], "top_k": 5}"#).unwrap();
        assert_eq!(o.apply(SamplingParams::default()).stop, ["a", "b"]);
        assert_eq!(o.top_k, Some(5));
    }

    #[test]
    fn a_negative_top_k_other_than_minus_one_is_refused() {
        let e = serde_json::from_str::<SamplingOverrides>(r#"{"top_k": -3}"#).unwrap_err();
        assert!(e.to_string().contains("top_k must be -1 or positive"), "{e}");
    }

    #[test]
    fn command_line_flags_are_the_same_parameters() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            s: SamplingOverrides,
        }
        let c = Cli::parse_from([
            "x",
            "--temperature",
            "0.7",
            "--stop",
            "a",
            "--stop",
            "b",
            "--stop-token-ids",
            "1,2",
            "--ignore-eos",
            "--max-tokens",
            "5",
        ]);
        let p = c.s.apply(SamplingParams::greedy());
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.stop, ["a", "b"]);
        assert_eq!(p.stop_token_ids, [1, 2]);
        assert!(p.ignore_eos);
        assert_eq!(p.max_tokens, Some(5));
        let none = Cli::parse_from(["x"]).s.apply(SamplingParams::greedy());
        assert_eq!(none, SamplingParams::greedy(), "no flag changes nothing");
    }

    #[test]
    fn library_defaults() {
        let p = SamplingParams::default();
        assert_eq!(p.max_tokens, Some(DEFAULT_MAX_TOKENS));
        assert_eq!((p.temperature, p.top_p, p.top_k), (1.0, 1.0, 0));
    }
}
