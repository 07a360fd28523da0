//! The engine: sequences, block manager, scheduler, model runner, and the step
//! loop (schedule → run → postprocess).

pub mod model_runner;

pub use model_runner::{ModelRunner, SeqChunk, StepResult};
