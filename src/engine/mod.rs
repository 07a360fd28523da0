//! The engine: sequences, block manager, scheduler, model runner, and the step
//! loop (schedule → run → postprocess).

pub mod block_manager;
pub mod config;
mod error;
pub mod handle;
pub mod llm_engine;
mod load_timings;
pub mod model_runner;
pub mod scheduler;
pub mod sequence;
mod stop_checker;

pub use block_manager::{BlockManager, BlockTable};
pub use config::{EngineConfig, KvPlan};
pub use error::EngineError;
pub use handle::{BlockStats, CompletedRequest, Engine, RequestStream};
pub use llm_engine::{LlmEngine, Prompt, RequestMetrics, RequestOutput};
pub use load_timings::LoadTimings;
pub use model_runner::{ModelRunner, SeqChunk, StepResult, StepRunner};
pub use scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
pub use sequence::{FinishReason, SeqId, SeqStatus, Sequence};
pub use stop_checker::StopChecker;
