//! Chrome's Trace Event Format (the JSON that Perfetto and chrome://tracing
//! open): `export` writes a recorder's ring as one, `validate` checks any file
//! against the format's documented fields and phases.
//!
//! Layout of a wllm trace (process 1): thread 0 is the engine's steps ("X"
//! events named `step`, args: index, tokens, prefill/decode split, batch size,
//! step_ms, preempted ids); thread `seq + 1` is request `seq` ("X" events
//! `waiting`, `prefill` (args: step, start, tokens), `decode` (args: step),
//! `preempted` (args: from_step, until_step, exclusive); "i" events `arrived`, `finished` (args: reason)); counters
//! ("C") `KV blocks`, `requests`, `prefix cache tokens`; and the block map as
//! object snapshots ("O", name `block_map`): the first holds the whole pool
//! before the first step (args.snapshot: step = that step, owners, refs,
//! cached), each later one the blocks a step changed (args.snapshot: step,
//! changes: [[block, owner, refs, cached], …]). `otherData.generator` is "wllm".

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::recorder::{BlockMap, RequestEvent, RequestEventKind, StepRecord, TraceRecorder, Work};

/// What the trace says about where it was taken.
#[derive(Clone, Debug, Default)]
pub struct TraceMeta {
    pub model: String,
    pub adapter: String,
}

const PID: u64 = 1;
/// The process of the server's model loads and unloads.
const MODELS_PID: u64 = 2;

fn tid(seq: u64) -> u64 {
    seq + 1
}

fn snapshot(ts: f64, snap: Value) -> Value {
    json!({"name": "block_map", "cat": "kv", "ph": "O", "id": "0x1", "pid": PID, "tid": 0, "ts": ts,
        "args": {"snapshot": snap}})
}

/// The recorder's ring as a Trace Event Format object.
pub fn export(r: &TraceRecorder, meta: &TraceMeta) -> Value {
    export_tail(r, meta, usize::MAX)
}

/// The last `tail` steps of the ring (and the request events since) as a
/// Trace Event Format object.
pub fn export_tail(r: &TraceRecorder, meta: &TraceMeta, tail: usize) -> Value {
    let skip = r.steps.len().saturating_sub(tail);
    let mut base = r.base_map.clone();
    for s in r.steps.iter().take(skip) {
        base.apply(&s.block_changes);
    }
    let steps: Vec<&StepRecord> = r.steps.iter().skip(skip).collect();
    let from_ts = steps.first().map_or(0.0, |s| s.start_us);
    let events: Vec<&RequestEvent> = r.events.iter().filter(|e| skip == 0 || e.ts_us >= from_ts).collect();
    export_parts(r, meta, &steps, &events, &base)
}

fn export_parts(
    r: &TraceRecorder,
    meta: &TraceMeta,
    steps: &[&StepRecord],
    events: &[&RequestEvent],
    base: &BlockMap,
) -> Value {
    let mut ev = vec![
        json!({"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "wllm engine"}}),
        json!({"name": "thread_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "engine steps"}}),
        json!({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": 0, "args": {"sort_index": -1}}),
    ];
    let first_ts = steps.first().map_or(0.0, |s| s.start_us);
    let first_step = steps.first().map_or(0, |s| s.index);
    ev.push(json!({"name": "block_map", "cat": "kv", "ph": "N", "id": "0x1", "pid": PID, "tid": 0, "ts": first_ts}));
    ev.push(snapshot(
        first_ts,
        json!({"step": first_step, "owners": base.owners, "refs": base.refs, "cached": base.cached}),
    ));
    // Each request: when it arrived, its first step, and its preemptions.
    let mut arrival: HashMap<u64, f64> = HashMap::new();
    let mut finish: HashMap<u64, f64> = HashMap::new();
    let mut seqs: BTreeMap<u64, ()> = BTreeMap::new();
    for e in events {
        seqs.insert(e.seq, ());
        let name = match &e.kind {
            RequestEventKind::Arrived { prompt_len } => {
                arrival.insert(e.seq, e.ts_us);
                ev.push(
                    json!({"name": "arrived", "cat": "request", "ph": "i", "s": "t", "pid": PID,
                    "tid": tid(e.seq), "ts": e.ts_us, "args": {"prompt_tokens": prompt_len}}),
                );
                continue;
            }
            RequestEventKind::Finished { reason } => {
                finish.insert(e.seq, e.ts_us);
                reason
            }
        };
        ev.push(
            json!({"name": "finished", "cat": "request", "ph": "i", "s": "t", "pid": PID,
            "tid": tid(e.seq), "ts": e.ts_us, "args": {"reason": name}}),
        );
    }
    // A sequence waiting (since arrival) or preempted (since that step) until it next runs.
    let mut pending: HashMap<u64, (&str, f64, u64)> = HashMap::new();
    for (&seq, &ts) in &arrival {
        pending.insert(
            seq,
            (
                "waiting",
                ts,
                steps.partition_point(|s| s.start_us < ts) as u64 + first_step,
            ),
        );
    }
    let span = |ev: &mut Vec<Value>, seq: u64, (name, ts, from): (&str, f64, u64), end: f64, to: u64| {
        ev.push(
            json!({"name": name, "cat": "request", "ph": "X", "pid": PID, "tid": tid(seq), "ts": ts,
            "dur": (end - ts).max(0.0), "args": {"from_step": from, "until_step": to}}),
        );
    };
    for s in steps {
        for &p in &s.preempted {
            seqs.insert(p, ());
            pending.insert(p, ("preempted", s.start_us, s.index));
        }
        let (mut prefill, mut decode) = (0, 0);
        for e in &s.entries {
            seqs.insert(e.seq, ());
            if let Some(w) = pending.remove(&e.seq) {
                span(&mut ev, e.seq, w, s.start_us, s.index);
            }
            let (name, args) = match e.work {
                Work::Prefill { start, len } => {
                    prefill += len;
                    ("prefill", json!({"step": s.index, "start": start, "tokens": len}))
                }
                Work::Decode => {
                    decode += 1;
                    ("decode", json!({"step": s.index}))
                }
            };
            ev.push(
                json!({"name": name, "cat": "request", "ph": "X", "pid": PID, "tid": tid(e.seq),
                "ts": s.start_us, "dur": s.dur_us, "args": args}),
            );
        }
        ev.push(
            json!({"name": "step", "cat": "step", "ph": "X", "pid": PID, "tid": 0, "ts": s.start_us,
            "dur": s.dur_us, "args": {"index": s.index, "tokens": prefill + decode, "prefill_tokens": prefill,
            "decode_tokens": decode, "batch": s.entries.len(), "step_ms": s.dur_us / 1e3, "preempted": s.preempted,
            "blocks_used": s.counters.blocks_used, "blocks_cached": s.counters.blocks_cached,
            "blocks_free": s.counters.blocks_free, "running": s.counters.running, "waiting": s.counters.waiting}}),
        );
        let end = s.start_us + s.dur_us;
        let c = &s.counters;
        ev.push(json!({"name": "KV blocks", "ph": "C", "pid": PID, "tid": 0, "ts": end,
            "args": {"used": c.blocks_used, "cached": c.blocks_cached, "free": c.blocks_free}}));
        ev.push(json!({"name": "requests", "ph": "C", "pid": PID, "tid": 0, "ts": end,
            "args": {"running": c.running, "waiting": c.waiting}}));
        ev.push(
            json!({"name": "prefix cache tokens", "ph": "C", "pid": PID, "tid": 0, "ts": end,
            "args": {"hits": c.prefix_hits, "queries": c.prefix_queries}}),
        );
        if !s.block_changes.is_empty() {
            let ch: Vec<Value> = s
                .block_changes
                .iter()
                .map(|c| json!([c.block, c.owner, c.refs, c.cached]))
                .collect();
            ev.push(snapshot(end, json!({"step": s.index, "changes": ch})));
        }
    }
    // Still waiting or preempted when the trace was taken.
    if let Some(last) = steps.last() {
        let end = last.start_us + last.dur_us;
        let mut open: Vec<_> = pending.into_iter().collect();
        open.sort_by_key(|(seq, _)| *seq);
        for (seq, w) in open {
            let until = finish.get(&seq).copied().unwrap_or(end);
            span(&mut ev, seq, w, until.max(w.1), last.index + 1);
        }
    }
    for &seq in seqs.keys() {
        ev.push(json!({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid(seq),
            "args": {"name": format!("request {seq}")}}));
        ev.push(
            json!({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid(seq),
            "args": {"sort_index": tid(seq)}}),
        );
    }
    model_events(r, &mut ev);
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "wllm",
            "version": env!("CARGO_PKG_VERSION"),
            "model": meta.model,
            "adapter": meta.adapter,
            "num_blocks": r.num_blocks,
            "block_size": r.block_size,
            "ring_capacity": r.capacity,
            "steps_recorded": steps.len(),
            "steps_dropped": r.dropped_steps + (r.steps.len() - steps.len()) as u64,
        }
    })
}

/// The server's model loads (spans) and unloads (instants), as a second
/// process of the trace.
fn model_events(r: &TraceRecorder, ev: &mut Vec<Value>) {
    if r.model_events.is_empty() {
        return;
    }
    ev.push(json!({"name": "process_name", "ph": "M", "pid": MODELS_PID, "tid": 0, "args": {"name": "models"}}));
    ev.push(
        json!({"name": "thread_name", "ph": "M", "pid": MODELS_PID, "tid": 0, "args": {"name": "loads and unloads"}}),
    );
    for m in &r.model_events {
        let name = format!("{} {}", m.what, m.model);
        let args = json!({"model": m.model, "detail": m.detail});
        ev.push(if m.what == "unload" {
            json!({"name": name, "cat": "model", "ph": "i", "s": "p", "pid": MODELS_PID, "tid": 0, "ts": m.ts_us,
                "args": args})
        } else {
            json!({"name": name, "cat": "model", "ph": "X", "pid": MODELS_PID, "tid": 0, "ts": m.ts_us,
                "dur": m.dur_us, "args": args})
        });
    }
}

/// The phases the format documents.
const PHASES: &[&str] = &[
    "B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")",
];
const METADATA: &[&str] = &[
    "process_name",
    "process_labels",
    "process_sort_index",
    "thread_name",
    "thread_sort_index",
];

/// Checks a whole trace: the JSON Array Format or the JSON Object Format
/// (`traceEvents`), and every event against the documented fields of its phase.
pub fn validate(v: &Value) -> Result<(), String> {
    let events = match v {
        Value::Array(a) => a,
        Value::Object(o) => {
            if let Some(u) = o.get("displayTimeUnit")
                && u != "ms"
                && u != "ns"
            {
                return Err(format!("displayTimeUnit must be \"ms\" or \"ns\", not {u}"));
            }
            o.get("traceEvents")
                .and_then(Value::as_array)
                .ok_or("a trace object needs a traceEvents array")?
        }
        _ => return Err("a trace is a JSON array of events or an object with traceEvents".into()),
    };
    let mut open: HashMap<(u64, u64), Vec<String>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        check_event(e, &mut open).map_err(|m| format!("event {i}: {m}: {e}"))?;
    }
    Ok(())
}

fn check_event(e: &Value, open: &mut HashMap<(u64, u64), Vec<String>>) -> Result<(), String> {
    let o = e.as_object().ok_or("an event must be an object")?;
    let ph = o.get("ph").and_then(Value::as_str).ok_or("no phase (ph)")?;
    if !PHASES.contains(&ph) {
        return Err(format!("unknown phase {ph:?}"));
    }
    let name = o.get("name").and_then(Value::as_str);
    if name.is_none() && ph != "E" {
        return Err("no name".into());
    }
    let int = |k: &str| {
        o.get(k)
            .map(|v| v.as_u64().ok_or(format!("{k} must be a non-negative integer")))
    };
    let pid = int("pid").transpose()?.ok_or("no pid")?;
    let tid = int("tid").transpose()?.unwrap_or(0);
    if ph != "M" {
        let ts = o.get("ts").and_then(Value::as_f64).ok_or("no numeric ts")?;
        if !ts.is_finite() || ts < 0.0 {
            return Err(format!("ts {ts} is not a time"));
        }
    }
    if let Some(c) = o.get("cat")
        && !c.is_string()
    {
        return Err("cat must be a string".into());
    }
    let args = o.get("args");
    if args.is_some_and(|a| !a.is_object()) {
        return Err("args must be an object".into());
    }
    match ph {
        "X" => {
            let d = o
                .get("dur")
                .and_then(Value::as_f64)
                .ok_or("a complete event needs dur")?;
            if !d.is_finite() || d < 0.0 {
                return Err(format!("dur {d} is not a duration"));
            }
        }
        "B" => open.entry((pid, tid)).or_default().push(name.unwrap_or("").into()),
        "E" => {
            open.get_mut(&(pid, tid))
                .and_then(Vec::pop)
                .ok_or("an end event without its begin")?;
        }
        "i" | "I" => {
            if let Some(s) = o.get("s")
                && !["g", "p", "t"].iter().any(|x| s == x)
            {
                return Err(format!("instant scope {s} is not g, p or t"));
            }
        }
        "C" => {
            let a = args.and_then(Value::as_object).ok_or("a counter needs args")?;
            if a.values().any(|v| !v.is_number()) {
                return Err("counter values must be numbers".into());
            }
        }
        "N" | "O" | "D" | "b" | "n" | "e" | "s" | "t" | "f" => {
            if !o.get("id").is_some_and(|i| i.is_string() || i.is_u64()) && !o.contains_key("id2") {
                return Err(format!("a {ph} event needs an id"));
            }
            if ph == "O" && args.and_then(|a| a.get("snapshot")).is_none() {
                return Err("an object snapshot needs args.snapshot".into());
            }
        }
        "M" => {
            let n = name.unwrap_or("");
            if !METADATA.contains(&n) {
                return Err(format!("unknown metadata event {n:?}"));
            }
            if args.is_none() {
                return Err("a metadata event needs args".into());
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(events: Value) -> Result<(), String> {
        validate(&json!({ "traceEvents": events }))
    }

    #[test]
    fn the_validator_takes_every_documented_shape() {
        let good = json!([
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "p"}},
            {"name": "a", "ph": "B", "pid": 1, "tid": 2, "ts": 1.0},
            {"ph": "E", "pid": 1, "tid": 2, "ts": 2.0},
            {"name": "x", "ph": "X", "pid": 1, "tid": 2, "ts": 3.0, "dur": 0.5, "cat": "c", "args": {}},
            {"name": "i", "ph": "i", "s": "t", "pid": 1, "tid": 2, "ts": 4.0},
            {"name": "c", "ph": "C", "pid": 1, "ts": 5.0, "args": {"a": 1, "b": 2.5}},
            {"name": "o", "ph": "N", "id": "0x1", "pid": 1, "ts": 5.0},
            {"name": "o", "ph": "O", "id": "0x1", "pid": 1, "ts": 6.0, "args": {"snapshot": {}}},
        ]);
        assert_eq!(ok(good.clone()), Ok(()));
        assert_eq!(validate(&good), Ok(()), "the JSON Array Format");
    }

    #[test]
    fn the_validator_names_what_is_wrong() {
        let cases = [
            (json!([{"name": "x", "ph": "X", "pid": 1, "ts": 1.0}]), "needs dur"),
            (json!([{"name": "x", "ph": "Q", "pid": 1, "ts": 1.0}]), "unknown phase"),
            (json!([{"ph": "E", "pid": 1, "tid": 1, "ts": 1.0}]), "without its begin"),
            (json!([{"name": "x", "ph": "i", "pid": 1}]), "no numeric ts"),
            (json!([{"name": "x", "ph": "i", "ts": 1.0}]), "no pid"),
            (json!([{"name": "x", "ph": "i", "pid": 1, "ts": -1.0}]), "not a time"),
            (
                json!([{"name": "x", "ph": "i", "s": "z", "pid": 1, "ts": 1.0}]),
                "instant scope",
            ),
            (
                json!([{"name": "c", "ph": "C", "pid": 1, "ts": 1.0, "args": {"a": "1"}}]),
                "must be numbers",
            ),
            (
                json!([{"name": "o", "ph": "O", "pid": 1, "ts": 1.0, "args": {"snapshot": {}}}]),
                "needs an id",
            ),
            (
                json!([{"name": "o", "ph": "O", "id": 1, "pid": 1, "ts": 1.0}]),
                "args.snapshot",
            ),
            (
                json!([{"name": "bogus", "ph": "M", "pid": 1, "args": {}}]),
                "unknown metadata",
            ),
            (
                json!([{"name": "x", "ph": "X", "pid": 1, "ts": 1.0, "dur": 1, "args": []}]),
                "args must be an object",
            ),
            (json!([7]), "must be an object"),
        ];
        for (events, want) in cases {
            let e = ok(events.clone()).expect_err(&events.to_string());
            assert!(e.contains(want), "{events}: {e}");
        }
        assert!(validate(&json!({"events": []})).is_err());
        assert!(validate(&json!({"traceEvents": [], "displayTimeUnit": "s"})).is_err());
        assert!(validate(&json!("trace")).is_err());
    }
}
