//! Writing models: a GGUF or a Hugging Face directory re-quantised into a new
//! GGUF at one of llama.cpp's mixes (`wllm quantize`). Above `model` and
//! `tokenizer` in the layering, since an HF directory's tokenizer becomes GGUF
//! metadata.

pub mod hf_to_gguf;
pub mod requantize;

pub use requantize::{QuantizeReport, quantize_model};
