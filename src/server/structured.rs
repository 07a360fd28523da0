//! A request's structured-output constraint, the OpenAI way
//! (`response_format`: `json_object`, `json_schema`) and vLLM's
//! (`structured_outputs` / the older `guided_*` fields: `json`, `regex`,
//! `choice`, `grammar`). More than one is a 400, as is a malformed one.

use serde_json::Value;

use super::error::ApiError;
use crate::sampling::constraint::Constraint;

/// The largest constraint a request may give (a schema as JSON, a regex, a
/// grammar, the choices together), in bytes: it is compiled into a parser
/// before the request starts.
pub const MAX_CONSTRAINT_BYTES: usize = 64 << 10;

/// A constraint's size as the request spelled it.
pub fn constraint_bytes(c: &Constraint) -> usize {
    match c {
        Constraint::JsonSchema(v) => v.to_string().len(),
        Constraint::JsonObject => 0,
        Constraint::Regex(r) | Constraint::Grammar(r) => r.len(),
        Constraint::Choice(v) => v.iter().map(|s| s.len() + 1).sum(),
    }
}

fn bad(msg: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(msg, Some(param))
}

fn schema(v: &Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| bad(format!("{param}: the schema is not JSON: {e}"), param))
        }
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        _ => Err(bad(format!("{param} must be a JSON schema object"), param)),
    }
}

/// The constraint the request body asks for, if any.
pub fn constraint_of(body: &Value) -> Result<Option<Constraint>, ApiError> {
    let mut found: Vec<(String, Constraint)> = Vec::new();
    let rf = &body["response_format"];
    if !rf.is_null() {
        match rf["type"].as_str() {
            Some("text") => {}
            Some("json_object") => found.push(("response_format".into(), Constraint::JsonObject)),
            Some("json_schema") => {
                let js = &rf["json_schema"];
                let s = js
                    .get("schema")
                    .ok_or_else(|| bad("response_format.json_schema needs a `schema`", "response_format"))?;
                found.push((
                    "response_format".into(),
                    Constraint::JsonSchema(schema(s, "response_format")?),
                ));
            }
            other => {
                return Err(bad(
                    format!("response_format type {other:?} is not supported (text, json_object, json_schema)"),
                    "response_format",
                ));
            }
        }
    }
    let so = &body["structured_outputs"];
    let fields = [
        ("json", so.get("json").or(body.get("guided_json"))),
        ("regex", so.get("regex").or(body.get("guided_regex"))),
        ("choice", so.get("choice").or(body.get("guided_choice"))),
        ("grammar", so.get("grammar").or(body.get("guided_grammar"))),
    ];
    for (kind, v) in fields {
        let Some(v) = v.filter(|v| !v.is_null()) else { continue };
        let param = "structured_outputs";
        let c = match kind {
            "json" => Constraint::JsonSchema(schema(v, param)?),
            "regex" => Constraint::Regex(v.as_str().ok_or_else(|| bad("regex must be a string", param))?.into()),
            "choice" => {
                let list = v
                    .as_array()
                    .ok_or_else(|| bad("choice must be a list of strings", param))?;
                let c: Option<Vec<String>> = list.iter().map(|x| x.as_str().map(String::from)).collect();
                Constraint::Choice(c.ok_or_else(|| bad("choice must be a list of strings", param))?)
            }
            _ => Constraint::Grammar(v.as_str().ok_or_else(|| bad("grammar must be a string", param))?.into()),
        };
        found.push((format!("{param}.{kind}"), c));
    }
    if let Some((name, c)) = found.iter().find(|(_, c)| constraint_bytes(c) > MAX_CONSTRAINT_BYTES) {
        return Err(bad(
            format!(
                "{name} is {} bytes; a structured-output constraint may be at most {MAX_CONSTRAINT_BYTES} bytes",
                constraint_bytes(c)
            ),
            name.split('.').next().unwrap_or(name),
        ));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        return Err(bad(
            format!("give one structured-output constraint, not {}", names.join(" and ")),
            "response_format",
        ));
    }
    Ok(found.pop().map(|(_, c)| c))
}
