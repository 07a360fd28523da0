//! `wllm trace FILE -o report.html`: a wllm trace (see `tef`) read back and
//! laid out for one self-contained page — the step timeline (requests as
//! rows, steps as columns, coloured by waiting / prefill / decode /
//! preempted) and the block map at any step. The page is `report.html` with
//! the data and `viz.js` inlined: no network, no build step.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::tef;

/// Why a trace cannot be reported.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not a complete JSON document ({msg}); was the trace cut short? Take it again with --trace")]
    NotJson { path: String, msg: String },
    #[error("{path} is not valid Trace Event Format: {msg}")]
    Invalid { path: String, msg: String },
    #[error(
        "{path} is a Chrome trace but not one wllm wrote (otherData.generator is not \"wllm\"); open it in Perfetto instead"
    )]
    Foreign { path: String },
}

/// Reads, checks and lays out a trace file for the report page.
pub fn load(path: &Path) -> Result<Value, TraceError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
        path: p.clone(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| TraceError::NotJson {
        path: p.clone(),
        msg: e.to_string(),
    })?;
    tef::validate(&v).map_err(|msg| TraceError::Invalid { path: p.clone(), msg })?;
    if v["otherData"]["generator"] != "wllm" {
        return Err(TraceError::Foreign { path: p });
    }
    Ok(layout(&v))
}

/// The report's data: steps, each request's cells (one character per step:
/// `.` absent, `w` waiting, `p` prefill, `d` decode, `x` preempted), and the
/// block maps by the step they begin at.
pub fn layout(v: &Value) -> Value {
    let events = v["traceEvents"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let steps: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "step" && e["tid"] == 0)
        .collect();
    let first = steps.first().and_then(|s| s["args"]["index"].as_u64()).unwrap_or(0);
    let n = steps.len();
    let step_rows: Vec<Value> = steps
        .iter()
        .map(|s| {
            let a = &s["args"];
            json!([
                a["index"],
                s["ts"].as_f64().unwrap_or(0.0) / 1e3,
                s["dur"].as_f64().unwrap_or(0.0) / 1e3,
                a["tokens"],
                a["prefill_tokens"],
                a["decode_tokens"],
                a["batch"],
                a["blocks_used"],
                a["blocks_cached"],
                a["blocks_free"],
                a["running"],
                a["waiting"],
                a["preempted"]
            ])
        })
        .collect();
    let mut reqs: BTreeMap<u64, (Vec<u8>, Value, Value, usize)> = BTreeMap::new();
    let cell = |i: u64| i.checked_sub(first).map(|i| i as usize).filter(|&i| i < n);
    for e in events {
        let Some(tid) = e["tid"].as_u64().filter(|&t| t > 0 && e["cat"] == "request") else {
            continue;
        };
        let r = reqs
            .entry(tid - 1)
            .or_insert_with(|| (vec![b'.'; n], Value::Null, Value::Null, 0));
        let a = &e["args"];
        match (e["ph"].as_str(), e["name"].as_str()) {
            (Some("X"), Some(k @ ("prefill" | "decode"))) => {
                if let Some(i) = a["step"].as_u64().and_then(cell) {
                    r.0[i] = if k == "prefill" { b'p' } else { b'd' };
                }
            }
            (Some("X"), Some(k @ ("waiting" | "preempted"))) => {
                let c = if k == "waiting" { b'w' } else { b'x' };
                r.3 += usize::from(k == "preempted");
                let (from, until) = (
                    a["from_step"].as_u64().unwrap_or(0),
                    a["until_step"].as_u64().unwrap_or(0),
                );
                for i in (from..until).filter_map(cell) {
                    if r.0[i] == b'.' {
                        r.0[i] = c;
                    }
                }
            }
            (Some("i"), Some("finished")) => r.1 = a["reason"].clone(),
            (Some("i"), Some("arrived")) => r.2 = a["prompt_tokens"].clone(),
            _ => {}
        }
    }
    let requests: Vec<Value> = reqs
        .into_iter()
        .map(|(id, (cells, finish, prompt, preemptions))| {
            json!({"id": id, "cells": String::from_utf8_lossy(&cells), "finish": finish,
                "prompt_tokens": prompt, "preemptions": preemptions})
        })
        .collect();
    // The whole pool before the first step, then each step's changes.
    let snaps = events
        .iter()
        .filter(|e| e["ph"] == "O" && e["name"] == "block_map")
        .map(|e| &e["args"]["snapshot"]);
    let mut base = Value::Null;
    let mut changes = Vec::new();
    for s in snaps {
        if s["owners"].is_array() && base.is_null() {
            base = s.clone();
        } else if s["changes"].is_array() {
            changes.push(s.clone());
        }
    }
    if base.is_null() {
        let n = v["otherData"]["num_blocks"].as_u64().unwrap_or(0) as usize;
        base = json!({"step": first, "owners": vec![-1; n], "refs": vec![0; n], "cached": vec![0; n]});
    }
    json!({"meta": v["otherData"], "first_step": first, "steps": step_rows, "requests": requests,
        "base_map": base, "map_changes": changes})
}

/// The block map and timeline drawing shared by the report and the live engine page.
pub const VIZ_JS: &str = include_str!("viz.js");
const PAGE: &str = include_str!("report.html");

/// The whole page for a laid-out trace.
pub fn render(data: &Value) -> String {
    // `</` cannot end the script element early once escaped.
    let json = data.to_string().replace("</", "<\\/");
    PAGE.replace("/*VIZ_JS*/", VIZ_JS).replace("/*TRACE_DATA*/null", &json)
}
