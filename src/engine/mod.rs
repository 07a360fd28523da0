//! The engine: sequences, block manager, scheduler, model runner, and the step
//! loop (schedule → run → postprocess).

pub mod block_manager;
pub mod config;
pub mod draft_model;
pub mod embedding;
mod error;
mod guided;
pub mod handle;
mod kv_cache;
pub mod kv_groups;
pub mod llm_engine;
mod load_timings;
pub mod memory_plan;
pub mod model_event;
pub mod model_runner;
mod output;
mod perplexity;
mod postprocess;
pub mod registry;
mod request;
pub mod scheduler;
pub mod sequence;
pub mod speculative;
#[cfg(test)]
mod speculative_props;
pub mod step_budget;
mod step_buffers;
mod stop_checker;
mod tracing;
mod warm_up;

pub use block_manager::{BlockManager, BlockTable, CachedPrefix, FREED};
pub use config::{EngineConfig, KvPlan};
pub use draft_model::DraftModel;
pub use error::EngineError;
pub use handle::{BlockStats, CompletedRequest, Engine, MetricsHandle, RequestStream, WeakEngine};
pub use kv_cache::KvCache;
pub use kv_groups::KvGroups;
pub use llm_engine::LlmEngine;
pub use load_timings::LoadTimings;
pub use memory_plan::{KvSizing, MemoryInputs, MemoryPlan};
pub use model_event::{ModelEvent, ModelEventKind, ModelObserver};
pub use model_runner::{ModelRunner, SeqChunk, StepResult, StepRunner};
pub use output::{RequestMetrics, RequestOutput};
pub use perplexity::{KlStats, Perplexity};
pub use registry::{ModelInfo, ModelRegistry};
pub use request::Prompt;
pub use scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
pub use sequence::{FinishReason, SeqId, SeqStatus, Sequence};
pub use step_buffers::StepBuffers;
pub use stop_checker::StopChecker;
pub use warm_up::RowTileChoice;
