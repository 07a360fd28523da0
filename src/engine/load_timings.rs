//! `LoadTimings`: where an engine's start-up went (device, tokenizer, weights,
//! pipelines, KV pool), printed on the start-up line and by `wllm info --timings`.

use crate::gpu::PipelineStats;

/// Seconds spent in each part of loading an engine.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LoadTimings {
    /// Opening the backend (adapter, device), less the pipelines compiled meanwhile.
    pub device: f64,
    /// Opening the model files, reading the config and building the tokenizer.
    pub tokenizer: f64,
    /// Reading, repacking and uploading every weight.
    pub weights: f64,
    /// Compiling pipelines during the load (more compile lazily, on first use).
    pub pipelines: f64,
    /// Allocating the KV pool and the step buffers.
    pub kv_pool: f64,
    pub total: f64,
    /// The device's pipelines at the end of the load.
    pub pipeline_stats: PipelineStats,
}

impl LoadTimings {
    /// One line: `total 1.2 s = device 0.1 + tokenizer 0.2 + ...`.
    pub fn describe(&self) -> String {
        let p = &self.pipeline_stats;
        let cache = match (p.disk_cache, p.disk_cache_loaded) {
            (false, _) => "no pipeline cache",
            (true, false) => "pipeline cache empty",
            (true, true) => "pipeline cache loaded",
        };
        format!(
            "load {:.2} s: device {:.2} s, tokenizer {:.2} s, weights {:.2} s, pipelines {:.2} s ({} compiled, {cache}), \
             KV pool {:.2} s",
            self.total, self.device, self.tokenizer, self.weights, self.pipelines, p.compiled, self.kv_pool
        )
    }
}
