//! The last guard of a request: a panic in a handler (a bug, never a
//! user's fault) becomes a 500 OpenAI error for that request instead of a
//! dropped connection whose bookkeeping (in-flight counts, the listener's
//! busy mark) would leak.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// A future whose panic is caught and returned as `Err`.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.0.as_mut();
        // The future is dropped after a panic (never polled again), so no
        // state it left half-updated is observed: AssertUnwindSafe holds.
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(p) => Poll::Ready(Err(p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into()))),
        }
    }
}

/// The middleware: runs the rest of the stack, a panic answered with a 500.
pub(crate) async fn catch_panic(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    match CatchUnwind(Box::pin(next.run(req))).await {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("wllm: a handler of {path} panicked: {msg}");
            ApiError::internal(format!(
                "the server failed on this request ({msg}); it is a bug: please report it"
            ))
            .into_response()
        }
    }
}
