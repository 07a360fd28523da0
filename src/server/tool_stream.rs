//! Tool calls as they are generated: a chat reply streamed with tools is read
//! piece by piece; while it may still be a call (`{"name": "…", "arguments": `)
//! nothing is sent, then it becomes either content deltas or a tool call — a
//! first delta with the call's id and function name, then the arguments'
//! text as it arrives (the outer object's closing brace held back until the
//! end), as OpenAI streams them. The arguments' deltas concatenate to exactly
//! the `arguments` string of the same reply unstreamed.

use serde_json::{Value, json};

use super::tools::{Head, ToolPlan, arguments_text, head};

enum Mode {
    Undecided,
    Content,
    Call { args_start: usize, sent: usize },
}

/// One choice's reply, turned into chat deltas as it streams.
pub struct ToolCallStream<'a> {
    plan: &'a ToolPlan,
    call_id: String,
    text: String,
    mode: Mode,
}

impl<'a> ToolCallStream<'a> {
    pub fn new(plan: &'a ToolPlan, call_id: String) -> Self {
        Self {
            plan,
            call_id,
            text: String::new(),
            mode: Mode::Undecided,
        }
    }

    /// The deltas for the next piece of the reply (`last`: the reply ends here).
    pub fn push(&mut self, piece: &str, last: bool) -> Vec<Value> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        if let Mode::Undecided = self.mode {
            match head(&self.text) {
                Head::Call { name, args_start } if self.plan.tools.iter().any(|t| t.name == name) => {
                    out.push(
                        json!({"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                        "function": {"name": name, "arguments": ""}}]}),
                    );
                    self.mode = Mode::Call { args_start, sent: 0 };
                }
                Head::Partial if !last => return out,
                _ => {
                    self.mode = Mode::Content;
                    out.push(json!({"content": self.text}));
                    return out;
                }
            }
        } else if let Mode::Content = self.mode {
            if !piece.is_empty() {
                out.push(json!({"content": piece}));
            }
            return out;
        }
        if let Mode::Call { args_start, sent } = &mut self.mode {
            let args = arguments_text(&self.text, *args_start);
            if args.len() > *sent {
                out.push(json!({"tool_calls": [{"index": 0, "function": {"arguments": &args[*sent..]}}]}));
                *sent = args.len();
            }
        }
        out
    }

    /// The finish reason to report: "tool_calls" when the reply is a whole call.
    pub fn finish_reason(&self, engine_reason: Value) -> Value {
        match self.mode {
            Mode::Call { .. } if self.plan.parse_output(&self.text, &self.call_id).is_some() => json!("tool_calls"),
            _ => engine_reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tools::{Tool, ToolChoice};

    fn plan() -> ToolPlan {
        let tool = |name: &str| Tool {
            name: name.into(),
            description: None,
            parameters: json!({"type": "object"}),
        };
        ToolPlan {
            tools: vec![tool("get_weather"), tool("f")],
            choice: ToolChoice::Auto,
        }
    }

    /// Streams `text` in pieces of `step` characters; returns (content, name,
    /// arguments, finish reason) as a client would assemble them.
    fn stream(text: &str, step: usize, engine_reason: &str) -> (String, Option<String>, String, Value) {
        let p = plan();
        let mut s = ToolCallStream::new(&p, "call_1".into());
        let chars: Vec<char> = text.chars().collect();
        let pieces: Vec<String> = chars.chunks(step).map(|c| c.iter().collect()).collect();
        let (mut content, mut name, mut args) = (String::new(), None, String::new());
        for (i, piece) in pieces.iter().enumerate() {
            for d in s.push(piece, i + 1 == pieces.len()) {
                if let Some(c) = d["content"].as_str() {
                    content.push_str(c);
                }
                let call = &d["tool_calls"][0];
                if let Some(n) = call["function"]["name"].as_str() {
                    assert!(name.is_none(), "the name is sent once");
                    assert_eq!(call["id"], "call_1");
                    name = Some(n.to_string());
                }
                if let Some(a) = call["function"]["arguments"].as_str() {
                    assert!(name.is_some(), "arguments before the name");
                    args.push_str(a);
                }
            }
        }
        (content, name, args, s.finish_reason(json!(engine_reason)))
    }

    #[test]
    fn head_waits_on_prefixes_and_refuses_other_text() {
        let call = r#"  {"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let at = call.find("{\"city").unwrap();
        for end in 0..at {
            assert_eq!(head(&call[..end]), Head::Partial, "{:?}", &call[..end]);
        }
        assert_eq!(
            head(call),
            Head::Call {
                name: "get_weather".into(),
                args_start: at
            }
        );
        for no in [
            "Hello",
            "{\"nam3\"",
            "{\"name\": 3",
            "{\"name\": \"a\\\"b\"",
            "[1]",
            "{\"name\": \"x\" \"a",
        ] {
            assert_eq!(head(no), Head::No, "{no}");
        }
    }

    #[test]
    fn a_call_streams_its_name_then_its_arguments_in_any_pieces() {
        let text = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": {\"n\": 2}}}";
        let want = plan().parse_output(text, "call_1").unwrap();
        for step in [1, 2, 3, 7, 1000] {
            let (content, name, args, reason) = stream(text, step, "stop");
            assert_eq!(content, "", "step {step}");
            assert_eq!(name.as_deref(), Some("get_weather"));
            assert_eq!(args, want[0]["function"]["arguments"].as_str().unwrap(), "step {step}");
            assert_eq!(args, "{\"city\": \"Paris\", \"days\": {\"n\": 2}}");
            assert_eq!(reason, "tool_calls");
        }
        // Whitespace around the closing brace stays out of the arguments.
        let (_, _, args, reason) = stream("{\"name\": \"f\", \"arguments\": {} }\n", 1, "stop");
        assert_eq!((args.as_str(), reason), ("{}", json!("tool_calls")));
    }

    #[test]
    fn other_replies_stream_as_content() {
        for (text, step) in [
            ("Hello, it is sunny.", 1),
            ("{\"name\": \"unknown\", \"arguments\": {}}", 2),
            ("{\"x\": 1}", 1),
            ("{", 1),
        ] {
            let (content, name, args, reason) = stream(text, step, "stop");
            assert_eq!((content.as_str(), name, args.as_str()), (text, None, ""));
            assert_eq!(reason, "stop");
        }
    }

    #[test]
    fn a_call_cut_short_keeps_the_engines_reason() {
        let (_, name, args, reason) = stream("{\"name\": \"f\", \"arguments\": {\"a\": \"xy", 3, "length");
        assert_eq!(name.as_deref(), Some("f"));
        assert_eq!(args, "{\"a\": \"xy");
        assert_eq!(reason, "length");
    }
}
