//! Step traces: what each engine step ran (prefill chunks beside decodes,
//! preemptions), where each request's KV blocks lived, and the pool's
//! counters — recorded in a bounded ring while the engine runs (`--trace`),
//! written as Chrome's Trace Event Format (Perfetto, chrome://tracing), and
//! turned into a self-contained HTML report by `wllm trace`.

pub mod recorder;
pub mod report;
pub mod tef;

pub use recorder::{BlockChange, BlockMap, Counters, StepEntry, StepRecord, TraceRecorder, Work};
pub use report::TraceError;
pub use tef::TraceMeta;
