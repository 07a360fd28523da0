//! The models a server serves: its primary engine's and, with a registry
//! (`ServerConfig::models`), more loaded on a request's first use. Here:
//! `/v1/models` (each with `loaded`), `/v1/models/{id}`, the load and unload
//! endpoints an app's settings screen calls, `/metrics` with one series a
//! loaded model (its `model_name` label) and the registry's gauges, and the
//! task that unloads idle models.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::engine::ModelRegistry;

fn card(s: &AppState, id: &str, loaded: bool, max_model_len: Option<usize>) -> Value {
    let mut c = json!({"id": id, "object": "model", "created": s.created, "owned_by": "wllm", "loaded": loaded});
    if let Some(n) = max_model_len {
        c["max_model_len"] = json!(n);
    }
    c
}

/// Every model: the primary one, then the registry's by name.
pub(super) fn cards(s: &AppState) -> Vec<Value> {
    let mut v = vec![card(
        s,
        &s.cfg.served_model_name,
        true,
        Some(s.engine.kv_plan().max_model_len),
    )];
    if let Some(r) = &s.cfg.models {
        let loaded: std::collections::HashMap<String, usize> = r
            .loaded()
            .into_iter()
            .map(|(n, e)| (n, e.kv_plan().max_model_len))
            .collect();
        for m in r.list() {
            let mut c = card(s, &m.name, m.loaded, loaded.get(&m.name).copied());
            c["bytes"] = json!(m.bytes);
            c["load_seconds"] = json!(m.load_seconds);
            c["loading"] = json!(m.loading);
            c["draining_bytes"] = json!(m.draining_bytes);
            v.push(c);
        }
    }
    v
}

pub async fn list(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": cards(&s)})).into_response()
}

pub async fn by_id(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match cards(&s).into_iter().find(|c| c["id"] == id.as_str()) {
        Some(c) => axum::Json(c).into_response(),
        None => not_found(&s, &id).into_response(),
    }
}

fn not_found(s: &AppState, id: &str) -> ApiError {
    let names: Vec<String> = cards(s)
        .iter()
        .filter_map(|c| c["id"].as_str().map(|n| format!("`{n}`")))
        .collect();
    ApiError::not_found(format!(
        "the model `{id}` does not exist; this server serves {}",
        names.join(", ")
    ))
}

fn registry_of(s: &AppState, id: &str) -> Result<Arc<ModelRegistry>, ApiError> {
    if id == s.cfg.served_model_name {
        return Err(ApiError::bad_request(
            format!("`{id}` is the server's primary model: it stays loaded"),
            None,
        ));
    }
    s.cfg
        .models
        .clone()
        .filter(|r| r.contains(id))
        .ok_or_else(|| not_found(s, id))
}

/// `POST /v1/models/{id}/load`: loads the model now (an app's settings
/// screen); answers with its card and the load's seconds.
pub async fn load(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    registry_of(&s, &id)?;
    let t = std::time::Instant::now();
    let state = s.for_model(Some(&id), None).await?;
    drop(state);
    let mut c = cards(&s)
        .into_iter()
        .find(|c| c["id"] == id.as_str())
        .unwrap_or_default();
    c["seconds"] = json!(t.elapsed().as_secs_f64());
    Ok(axum::Json(c).into_response())
}

/// `POST /v1/models/{id}/unload`: unloads the model; its requests in flight
/// finish first, then its memory goes.
pub async fn unload(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let reg = registry_of(&s, &id)?;
    let name = id.clone();
    let was = tokio::task::spawn_blocking(move || reg.unload(&name))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(axum::Json(json!({"id": id, "object": "model", "loaded": false, "was_loaded": was})).into_response())
}

/// Prometheus texts of several models as one exposition: each metric family
/// once (its HELP and TYPE), with every text's samples of it.
fn merge_families(texts: &[String]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut fams: std::collections::HashMap<String, (Vec<String>, Vec<String>)> = Default::default();
    for text in texts {
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
                current = rest.split(' ').next().unwrap_or("").to_string();
                let f = fams.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    Default::default()
                });
                if f.0.len() < 2 && !f.0.iter().any(|h| h == line) {
                    f.0.push(line.to_string());
                }
            } else if !line.is_empty() {
                fams.entry(current.clone())
                    .or_insert_with(|| {
                        order.push(current.clone());
                        Default::default()
                    })
                    .1
                    .push(line.to_string());
            }
        }
    }
    let mut out = String::new();
    for name in order {
        let (head, samples) = &fams[&name];
        for l in head.iter().chain(samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// How long the whole scrape may take (the registry's list and the device's count).
pub const METRICS_TIMEOUT: Duration = Duration::from_secs(10);

/// `/metrics`. Each engine's series come from the metrics its engine thread
/// publishes after every step (`Engine::metrics_handle`): a scrape neither
/// waits on a step nor holds a model's engine (so it never keeps a model
/// "busy" or alive past its unload); the rest answers within `METRICS_TIMEOUT`.
pub async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let mut handles = vec![(s.cfg.served_model_name.clone(), s.engine.metrics_handle())];
    if let Some(r) = &s.cfg.models {
        handles.extend(r.loaded().into_iter().map(|(n, e)| (n, e.metrics_handle())));
    }
    let registry = s.cfg.models.clone();
    let work = tokio::task::spawn_blocking(move || {
        let mut texts: Vec<String> = handles
            .iter()
            .map(|(name, h)| h.snapshot().to_prometheus(name))
            .collect();
        if let Some(r) = registry {
            let mut t = String::from(
                "# HELP wllm:model_loaded Whether the model is loaded (1) or not (0)\n# TYPE wllm:model_loaded gauge\n",
            );
            let mut secs = String::from(
                "# HELP wllm:model_load_seconds Seconds the model's last load took\n# TYPE wllm:model_load_seconds gauge\n",
            );
            for m in r.list() {
                let l = format!("{{model_name=\"{}\"}}", m.name.replace('"', "'"));
                t.push_str(&format!("wllm:model_loaded{l} {}\n", u8::from(m.loaded)));
                if let Some(x) = m.load_seconds {
                    secs.push_str(&format!("wllm:model_load_seconds{l} {x}\n"));
                }
            }
            let device = format!(
                "# HELP wllm:device_memory_bytes Bytes of the device's live buffers and textures, every model's, as \
                 wgpu counts them\n# TYPE wllm:device_memory_bytes gauge\nwllm:device_memory_bytes {}\n",
                r.device_bytes()
            );
            texts.push(t + &secs + &device);
        }
        Ok::<_, crate::engine::EngineError>(texts)
    });
    let texts = match tokio::time::timeout(METRICS_TIMEOUT, work).await {
        Ok(t) => t,
        Err(_) => {
            return ApiError::overloaded(format!("the metrics did not come together within {METRICS_TIMEOUT:?}"))
                .into_response();
        }
    };
    match texts {
        Ok(Ok(texts)) => {
            let text = merge_families(&texts);
            let text = if s.cfg.vllm_metric_names {
                crate::metrics::with_vllm_names(&text)
            } else {
                text
            };
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

/// Every second, unloads the registry's models idle past their keep-alive
/// (the registry's `idle_unload`, or a request's `keep_alive`).
pub async fn unload_idle_models(reg: Arc<ModelRegistry>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = reg.clone();
        // The registry's observer logs what goes.
        let _ = tokio::task::spawn_blocking(move || r.unload_idle()).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn families_merge_with_one_head_each() {
        let a =
            "# HELP x X\n# TYPE x counter\nx{model_name=\"a\"} 1\n# HELP y Y\n# TYPE y gauge\ny{model_name=\"a\"} 2\n";
        let b = "# HELP x X\n# TYPE x counter\nx{model_name=\"b\"} 3\n";
        let m = super::merge_families(&[a.into(), b.into()]);
        assert_eq!(
            m,
            "# HELP x X\n# TYPE x counter\nx{model_name=\"a\"} 1\nx{model_name=\"b\"} 3\n# HELP y Y\n# TYPE y gauge\ny{model_name=\"a\"} 2\n"
        );
    }
}
