//! OpenAI tool calls on chat completions: `tools` and `tool_choice`
//! ("none", "auto", "required", or a named function). The prompt is the
//! model's chat template with `tools` when the template uses them, else the
//! documented fallback: a system message listing each function's JSON schema
//! and asking for `{"name": …, "arguments": {…}}`. "required" and a named
//! function are enforced by a JSON-schema constraint; with "auto" a reply
//! that is such an object (naming a listed function) becomes a tool call.
//! `head` recognises the start of such an object as it streams.

use serde_json::{Value, json};

use super::error::ApiError;
use crate::ChatMessage;
use crate::sampling::constraint::Constraint;
use crate::tokenizer::Tokenizer;

/// One function the model may call.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    Required,
    Named(String),
}

/// The tools of a request and how they may be used.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
}

/// The most functions a request's `tools` may list.
pub const MAX_TOOLS: usize = 128;

fn bad(msg: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(msg, Some(param))
}

/// The body's tool plan; None without tools or with `tool_choice: "none"`.
pub fn plan(body: &Value) -> Result<Option<ToolPlan>, ApiError> {
    let needs_tools = match &body["tool_choice"] {
        Value::Null => false,
        Value::String(s) => s != "none" && s != "auto",
        _ => true,
    };
    let tools = match &body["tools"] {
        Value::Null | Value::Array(_) if needs_tools && body["tools"].as_array().is_none_or(|a| a.is_empty()) => {
            return Err(bad(
                "tool_choice asks for a tool call but the request has no tools",
                "tool_choice",
            ));
        }
        Value::Null => return Ok(None),
        Value::Array(a) if a.is_empty() => return Ok(None),
        Value::Array(a) => a,
        _ => return Err(bad("tools must be a list", "tools")),
    };
    if tools.len() > MAX_TOOLS {
        return Err(bad(
            format!("tools takes at most {MAX_TOOLS} functions, got {}", tools.len()),
            "tools",
        ));
    }
    let schema_bytes: usize = tools
        .iter()
        .map(|t| t["function"]["parameters"].to_string().len())
        .sum();
    if schema_bytes > super::structured::MAX_CONSTRAINT_BYTES {
        return Err(bad(
            format!(
                "the tools' parameter schemas are {schema_bytes} bytes together; at most {} (they become one \
                 grammar)",
                super::structured::MAX_CONSTRAINT_BYTES
            ),
            "tools",
        ));
    }
    let mut out = Vec::new();
    for t in tools {
        if t["type"] != "function" {
            return Err(bad(
                format!("tool type {} is not supported (function)", t["type"]),
                "tools",
            ));
        }
        let f = &t["function"];
        let name = f["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("a function needs a name", "tools"))?;
        let parameters = match &f["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            p @ Value::Object(_) => p.clone(),
            _ => {
                return Err(bad(
                    format!("the parameters of {name} must be a JSON schema object"),
                    "tools",
                ));
            }
        };
        out.push(Tool {
            name: name.to_string(),
            description: f["description"].as_str().map(String::from),
            parameters,
        });
    }
    let choice = match &body["tool_choice"] {
        Value::Null => ToolChoice::Auto,
        Value::String(s) if s == "none" => return Ok(None),
        Value::String(s) if s == "auto" => ToolChoice::Auto,
        Value::String(s) if s == "required" => ToolChoice::Required,
        v => {
            let name = v["function"]["name"].as_str().ok_or_else(|| {
                bad(
                    "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": …}}",
                    "tool_choice",
                )
            })?;
            if !out.iter().any(|t| t.name == name) {
                return Err(bad(
                    format!("tool_choice names {name:?}, which is not among the tools"),
                    "tool_choice",
                ));
            }
            ToolChoice::Named(name.to_string())
        }
    };
    Ok(Some(ToolPlan { tools: out, choice }))
}

impl ToolPlan {
    fn call_schema(t: &Tool) -> Value {
        json!({
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": false
        })
    }

    /// The constraint "required" and named choices impose.
    pub fn constraint(&self) -> Option<Constraint> {
        match &self.choice {
            ToolChoice::Auto => None,
            ToolChoice::Required => Some(Constraint::JsonSchema(
                json!({"anyOf": self.tools.iter().map(Self::call_schema).collect::<Vec<_>>()}),
            )),
            ToolChoice::Named(n) => self
                .tools
                .iter()
                .find(|t| &t.name == n)
                .map(|t| Constraint::JsonSchema(Self::call_schema(t))),
        }
    }

    fn openai_tools(&self) -> Value {
        json!(
            self.tools
                .iter()
                .map(|t| json!({"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect::<Vec<_>>()
        )
    }

    /// The prompt text: the model's template with `tools` when it uses them,
    /// else the fallback system message before the conversation; refused
    /// past `max_bytes` (`Tokenizer::max_prompt_bytes`) or the template's fuel.
    pub fn render(&self, tok: &Tokenizer, messages: &[ChatMessage], max_bytes: usize) -> Result<String, ApiError> {
        let err = |e: crate::tokenizer::TokenizerError| ApiError::bad_request(e.to_string(), Some("messages"));
        if tok.chat_template.as_deref().is_some_and(|t| t.contains("tools")) {
            return tok
                .apply_chat_template_capped(messages, Some(&self.openai_tools()), max_bytes)
                .map_err(err);
        }
        let mut sys = String::from(
            "You can call functions. To call one, reply with only a JSON object {\"name\": <function name>, \
             \"arguments\": <arguments object>} and nothing else. The functions:\n",
        );
        for t in &self.tools {
            sys.push_str(&format!(
                "- {}: {} Arguments (JSON schema): {}\n",
                t.name,
                t.description.as_deref().unwrap_or(""),
                t.parameters
            ));
        }
        let mut all = vec![ChatMessage::new("system", sys.trim_end())];
        all.extend(messages.iter().cloned());
        tok.apply_chat_template_capped(&all, None, max_bytes).map_err(err)
    }

    /// The reply as OpenAI tool calls, when it is one.
    pub fn parse_output(&self, text: &str, call_id: &str) -> Option<Value> {
        let v: Value = serde_json::from_str(text.trim()).ok()?;
        let name = v["name"].as_str()?;
        if !self.tools.iter().any(|t| t.name == name) || !v["arguments"].is_object() {
            return None;
        }
        // The arguments as the model wrote them (what streaming sends), else re-serialised.
        let args = match head(text) {
            Head::Call { args_start, .. } => arguments_text(text, args_start).to_string(),
            _ => v["arguments"].to_string(),
        };
        Some(json!([{"id": call_id, "type": "function",
            "function": {"name": name, "arguments": args}}]))
    }
}

/// How far a reply matches the head of a call.
#[derive(Debug, PartialEq)]
pub enum Head {
    /// Could still become one.
    Partial,
    /// A call of `name`, its arguments starting at byte `args_start`.
    Call { name: String, args_start: usize },
    /// Not a call.
    No,
}

/// Matches `{"name": "NAME", "arguments": ` (any whitespace between tokens,
/// leading whitespace allowed) at the start of `s`.
pub fn head(s: &str) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each literal must match; running out of text on the way is `Partial`.
    let lit = |i: &mut usize, l: &[u8]| -> Option<Head> {
        for &c in l {
            match b.get(*i) {
                None => return Some(Head::Partial),
                Some(&x) if x == c => *i += 1,
                Some(_) => return Some(Head::No),
            }
        }
        None
    };
    ws(&mut i);
    if let Some(h) = lit(&mut i, b"{") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, b"\"name\"") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, b":") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, b"\"") {
        return h;
    }
    let start = i;
    while i < b.len() && b[i] != b'"' {
        if b[i] == b'\\' || b[i] < 0x20 {
            return Head::No;
        }
        i += 1;
    }
    if i == b.len() {
        return Head::Partial;
    }
    let name = s[start..i].to_string();
    i += 1;
    ws(&mut i);
    if let Some(h) = lit(&mut i, b",") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, b"\"arguments\"") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, b":") {
        return h;
    }
    ws(&mut i);
    if i == b.len() {
        return Head::Partial;
    }
    Head::Call { name, args_start: i }
}

/// The arguments' text of a reply whose arguments start at `args_start`:
/// everything up to the last closing brace (the call object's), trailing
/// whitespace removed. On a prefix of a reply it is a prefix of the final one.
pub fn arguments_text(s: &str, args_start: usize) -> &str {
    let t = s[args_start..].trim_end();
    t.strip_suffix('}').unwrap_or(t).trim_end()
}
