//! Engine metrics with vLLM's names under the `wllm:` prefix: latency histograms
//! (TTFT, ITL, end-to-end, queue, prefill, decode), request gauges, token and
//! prefix-cache counters, KV usage and GPU memory with peaks. Timestamps come
//! from the engine's monotonic clock (`Instant`).

use std::fmt::Write;

/// Prometheus-style cumulative histogram in seconds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
    /// Every observation, for exact percentiles in reports (bounded).
    #[serde(skip)]
    pub samples: Vec<f64>,
}

const MAX_SAMPLES: usize = 100_000;

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
            samples: Vec::new(),
        }
    }
    pub fn latency() -> Self {
        Self::new(&[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0,
        ])
    }
    pub fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push(v);
        }
    }
    /// The q-quantile (0..=1) of the observations, if any.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        percentile(&self.samples, q)
    }
}

/// The q-quantile of `v` (nearest rank on sorted values).
pub fn percentile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let i = ((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1);
    Some(s[i])
}

/// A snapshot of everything the engine measures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Metrics {
    pub time_to_first_token_seconds: Histogram,
    pub inter_token_latency_seconds: Histogram,
    pub e2e_request_latency_seconds: Histogram,
    pub request_queue_time_seconds: Histogram,
    pub request_prefill_time_seconds: Histogram,
    pub request_decode_time_seconds: Histogram,
    pub num_requests_running: u64,
    pub num_requests_waiting: u64,
    pub kv_cache_usage_perc: f64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub prefix_cache_queries_total: u64,
    pub prefix_cache_hits_total: u64,
    pub num_preemptions_total: u64,
    /// Speculative decoding (vLLM's `spec_decode_*`): steps a sequence
    /// verified drafts in, tokens drafted, drafts accepted.
    pub spec_decode_num_drafts_total: u64,
    pub spec_decode_num_draft_tokens_total: u64,
    pub spec_decode_num_accepted_tokens_total: u64,
    /// Embedding requests answered.
    pub embedding_requests_total: u64,
    pub request_success_total: u64,
    pub gpu_memory_allocated_bytes: u64,
    pub gpu_memory_allocated_peak_bytes: u64,
    pub gpu_memory_reserved_bytes: u64,
    pub gpu_memory_reserved_peak_bytes: u64,
    pub num_steps_total: u64,
    /// Structured output: token masks computed, and their CPU seconds (beside the steps).
    pub structured_masks_total: u64,
    pub structured_mask_seconds_total: f64,
    /// Greedy structured-output tokens picked by the masked argmax on the device.
    pub structured_device_picks_total: u64,
    /// Logits rows (a vocabulary each) read back to the CPU for sampling.
    pub logits_rows_read_total: u64,
    /// Seconds the engine spent recording its step trace, and in its steps.
    pub trace_record_seconds_total: f64,
    pub step_seconds_total: f64,
    /// Compute pipelines compiled on the engine's device so far (each once: in
    /// the warm-up, or by the first step that runs it) and their seconds.
    pub pipelines_compiled_total: u64,
    pub pipeline_compile_seconds_total: f64,
    /// The KV cache's configuration, set once the pool is made.
    pub cache_config: CacheConfig,
}

/// The KV cache's configuration, as `wllm:cache_config_info` labels (vLLM's
/// `cache_config_info`) and the pool's bytes.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CacheConfig {
    pub cache_dtype: String,
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub bytes_per_token: usize,
    pub pool_bytes: u64,
    /// The weights' and step buffers' bytes on the device, as allocated.
    pub weight_bytes: u64,
    pub step_buffer_bytes: u64,
    /// The adapter's memory as its driver reports it (0: not reported).
    pub device_memory_bytes: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        let h = Histogram::latency;
        Self {
            time_to_first_token_seconds: h(),
            inter_token_latency_seconds: h(),
            e2e_request_latency_seconds: h(),
            request_queue_time_seconds: h(),
            request_prefill_time_seconds: h(),
            request_decode_time_seconds: h(),
            num_requests_running: 0,
            num_requests_waiting: 0,
            kv_cache_usage_perc: 0.0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            prefix_cache_queries_total: 0,
            prefix_cache_hits_total: 0,
            num_preemptions_total: 0,
            spec_decode_num_drafts_total: 0,
            spec_decode_num_draft_tokens_total: 0,
            spec_decode_num_accepted_tokens_total: 0,
            embedding_requests_total: 0,
            request_success_total: 0,
            gpu_memory_allocated_bytes: 0,
            gpu_memory_allocated_peak_bytes: 0,
            gpu_memory_reserved_bytes: 0,
            gpu_memory_reserved_peak_bytes: 0,
            num_steps_total: 0,
            structured_masks_total: 0,
            structured_mask_seconds_total: 0.0,
            structured_device_picks_total: 0,
            logits_rows_read_total: 0,
            trace_record_seconds_total: 0.0,
            step_seconds_total: 0.0,
            pipelines_compiled_total: 0,
            pipeline_compile_seconds_total: 0.0,
            cache_config: CacheConfig::default(),
        }
    }
}

impl Metrics {
    /// Prometheus text exposition format.
    pub fn to_prometheus(&self, model_name: &str) -> String {
        let mut s = String::new();
        let l = format!("{{model_name=\"{}\"}}", model_name.replace('"', "'"));
        let hists = [
            (
                "time_to_first_token_seconds",
                "Time to first token",
                &self.time_to_first_token_seconds,
            ),
            (
                "inter_token_latency_seconds",
                "Time between consecutive output tokens",
                &self.inter_token_latency_seconds,
            ),
            (
                "e2e_request_latency_seconds",
                "End-to-end request latency",
                &self.e2e_request_latency_seconds,
            ),
            (
                "request_queue_time_seconds",
                "Time waiting before the first step",
                &self.request_queue_time_seconds,
            ),
            (
                "request_prefill_time_seconds",
                "Time from first step to first token",
                &self.request_prefill_time_seconds,
            ),
            (
                "request_decode_time_seconds",
                "Time from first token to the last",
                &self.request_decode_time_seconds,
            ),
        ];
        for (name, help, h) in hists {
            let _ = writeln!(s, "# HELP wllm:{name} {help}.\n# TYPE wllm:{name} histogram");
            let inner = &l[1..l.len() - 1];
            for (b, c) in h.bounds.iter().zip(&h.counts) {
                let _ = writeln!(s, "wllm:{name}_bucket{{{inner},le=\"{b}\"}} {c}");
            }
            let _ = writeln!(s, "wllm:{name}_bucket{{{inner},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(s, "wllm:{name}_sum{l} {}\nwllm:{name}_count{l} {}", h.sum, h.count);
        }
        let gauges = [
            (
                "num_requests_running",
                "Requests in the running batch",
                self.num_requests_running as f64,
            ),
            (
                "num_requests_waiting",
                "Requests waiting to be scheduled",
                self.num_requests_waiting as f64,
            ),
            (
                "kv_cache_usage_perc",
                "Fraction of KV blocks in use (0-1)",
                self.kv_cache_usage_perc,
            ),
            (
                "gpu_memory_allocated_bytes",
                "Bytes in live GPU buffers",
                self.gpu_memory_allocated_bytes as f64,
            ),
            (
                "gpu_memory_allocated_peak_bytes",
                "Peak of gpu_memory_allocated_bytes",
                self.gpu_memory_allocated_peak_bytes as f64,
            ),
            (
                "gpu_memory_reserved_bytes",
                "Bytes reserved, the whole KV pool included",
                self.gpu_memory_reserved_bytes as f64,
            ),
            (
                "gpu_memory_reserved_peak_bytes",
                "Peak of gpu_memory_reserved_bytes",
                self.gpu_memory_reserved_peak_bytes as f64,
            ),
            (
                "kv_cache_bytes",
                "Bytes of the KV pool (of cache_config_info's cache_dtype)",
                self.cache_config.pool_bytes as f64,
            ),
            (
                "kv_cache_bytes_per_token",
                "KV bytes one token takes in every layer (2 L H_kv d_h, times the dtype's bytes)",
                self.cache_config.bytes_per_token as f64,
            ),
            (
                "model_weights_bytes",
                "Bytes of the weights on the device, rope tables included",
                self.cache_config.weight_bytes as f64,
            ),
            (
                "step_buffer_bytes",
                "Bytes of the step buffers (activations, logits, ids, block tables)",
                self.cache_config.step_buffer_bytes as f64,
            ),
            (
                "gpu_memory_total_bytes",
                "The adapter's memory as its driver reports it (0: not reported)",
                self.cache_config.device_memory_bytes as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                s,
                "# HELP wllm:{name} {help}.\n# TYPE wllm:{name} gauge\nwllm:{name}{l} {v}"
            );
        }
        let c = &self.cache_config;
        let inner = &l[1..l.len() - 1];
        let _ = writeln!(
            s,
            "# HELP wllm:cache_config_info The KV cache's configuration.\n# TYPE wllm:cache_config_info gauge\n\
             wllm:cache_config_info{{{inner},block_size=\"{}\",cache_dtype=\"{}\",num_gpu_blocks=\"{}\"}} 1",
            c.block_size, c.cache_dtype, c.num_gpu_blocks
        );
        let counters = [
            (
                "prompt_tokens_total",
                "Prompt tokens processed",
                self.prompt_tokens_total,
            ),
            (
                "generation_tokens_total",
                "Tokens generated",
                self.generation_tokens_total,
            ),
            (
                "prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache",
                self.prefix_cache_queries_total,
            ),
            (
                "prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache",
                self.prefix_cache_hits_total,
            ),
            (
                "spec_decode_num_drafts_total",
                "Speculative drafts verified (one a sequence a step)",
                self.spec_decode_num_drafts_total,
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "Speculative tokens drafted and verified",
                self.spec_decode_num_draft_tokens_total,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "Speculative tokens accepted",
                self.spec_decode_num_accepted_tokens_total,
            ),
            (
                "embedding_requests_total",
                "Embedding requests answered",
                self.embedding_requests_total,
            ),
            (
                "num_preemptions_total",
                "Requests preempted",
                self.num_preemptions_total,
            ),
            ("request_success_total", "Requests finished", self.request_success_total),
            (
                "structured_masks_total",
                "Structured-output token masks computed",
                self.structured_masks_total,
            ),
            (
                "structured_device_picks_total",
                "Greedy structured-output tokens picked by a masked argmax on the device",
                self.structured_device_picks_total,
            ),
            (
                "logits_rows_read_total",
                "Logits rows read back to the CPU for sampling",
                self.logits_rows_read_total,
            ),
            (
                "pipelines_compiled_total",
                "Compute pipelines compiled on the engine's device, each once (warm-up or first use)",
                self.pipelines_compiled_total,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                s,
                "# HELP wllm:{name} {help}.\n# TYPE wllm:{name} counter\nwllm:{name}{l} {v}"
            );
        }
        for (name, help, v) in [
            (
                "trace_record_seconds_total",
                "Seconds spent recording the step trace",
                self.trace_record_seconds_total,
            ),
            (
                "step_seconds_total",
                "Seconds spent in engine steps",
                self.step_seconds_total,
            ),
            (
                "pipeline_compile_seconds_total",
                "Seconds spent compiling pipelines_compiled_total",
                self.pipeline_compile_seconds_total,
            ),
        ] {
            let _ = writeln!(
                s,
                "# HELP wllm:{name} {help}.\n# TYPE wllm:{name} counter\nwllm:{name}{l} {v}"
            );
        }
        let _ = writeln!(
            s,
            "# HELP wllm:structured_mask_seconds_total CPU seconds spent computing structured-output masks.\n\
             # TYPE wllm:structured_mask_seconds_total counter\nwllm:structured_mask_seconds_total{l} {}",
            self.structured_mask_seconds_total
        );
        s
    }
}

/// `text` (wllm's /metrics) followed by the same series under vLLM's own
/// `vllm:` names, as routers and endpoint pickers built for vLLM scrape them
/// (`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
/// `vllm:prefix_cache_hits_total`, …), and the older
/// `vllm:gpu_cache_usage_perc` beside `vllm:kv_cache_usage_perc`.
pub fn with_vllm_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2 + 256);
    out.push_str(text);
    let mut older = String::new();
    for line in text.lines() {
        let renamed = line.replace("wllm:", "vllm:");
        out.push_str(&renamed);
        out.push('\n');
        if renamed.contains("vllm:kv_cache_usage_perc") {
            older.push_str(&renamed.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"));
            older.push('\n');
        }
    }
    out.push_str(&older);
    out
}

#[cfg(test)]
mod vllm_name_tests {
    use super::*;

    #[test]
    fn every_series_also_goes_under_vllms_names() {
        let m = Metrics::default();
        let text = m.to_prometheus("m");
        let both = with_vllm_names(&text);
        for name in [
            "num_requests_waiting",
            "num_requests_running",
            "kv_cache_usage_perc",
            "prefix_cache_queries_total",
            "prefix_cache_hits_total",
            "time_to_first_token_seconds_bucket",
        ] {
            assert!(both.contains(&format!("wllm:{name}{{")), "{name}");
            assert!(both.contains(&format!("vllm:{name}{{")), "{name}");
        }
        assert!(both.contains("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0"));
        assert!(both.contains("# TYPE vllm:gpu_cache_usage_perc gauge"));
        // As many vllm: series as wllm: ones, plus the older alias.
        let count = |p: &str| both.lines().filter(|l| l.starts_with(p)).count();
        assert_eq!(count("vllm:"), count("wllm:") + 1);
    }
}
