//! `ModelEvent`: a load or unload of a `ModelRegistry`'s model, as told to
//! its observer (the server logs each one and puts it in its step trace).

use std::sync::Arc;
use std::time::Instant;

/// A load or unload, as told to the registry's observer.
#[derive(Clone, Debug)]
pub struct ModelEvent {
    pub model: String,
    pub kind: ModelEventKind,
    /// When it began and ended (an unload: the same instant twice).
    pub start: Instant,
    pub end: Instant,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ModelEventKind {
    /// A load began (its bytes reserved; the registry is not locked while it runs).
    Loading,
    /// Loaded: seconds in all, of which `warm_up_seconds` warming its pipelines up.
    Loaded {
        seconds: f64,
        warm_up_seconds: f64,
        bytes: u64,
    },
    LoadFailed {
        error: String,
    },
    /// Unloaded: `reason` is "request", "idle" or "evicted" (to make room for another).
    Unloaded {
        reason: &'static str,
    },
}

impl ModelEvent {
    /// One line for a log.
    pub fn describe(&self) -> String {
        let m = &self.model;
        match &self.kind {
            ModelEventKind::Loading => format!("loading model {m}"),
            ModelEventKind::Loaded {
                seconds,
                warm_up_seconds,
                bytes,
            } => format!(
                "loaded model {m} in {seconds:.2} s (warm-up {warm_up_seconds:.2} s), {}",
                mib(*bytes)
            ),
            ModelEventKind::LoadFailed { error } => format!("loading model {m} failed: {error}"),
            ModelEventKind::Unloaded { reason } => format!("unloaded model {m} ({reason})"),
        }
    }
}

/// Told every load and unload.
pub type ModelObserver = Arc<dyn Fn(&ModelEvent) + Send + Sync>;

pub(super) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}
