//! Connections: the accept loop under a cap on open connections (one past it
//! gets a 503 and is closed at once, so descriptors never run out), HTTP/1.1
//! with a deadline for each request head — which closes connections that send
//! nothing, send headers slowly or sit idle between keep-alive requests — and
//! the soft open-file limit raised to the hard one at start.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Raises the soft limit on open files to the hard limit; returns the soft
/// limit now in force (None where there is no such limit).
pub fn raise_nofile_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through a valid, exclusive pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
            return None;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max.min(1 << 20),
                rlim_max: rl.rlim_max,
            };
            // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
                rl.rlim_cur = want.rlim_cur;
            }
        }
        // rlim_t is u64 on Linux but not on every unix.
        #[allow(clippy::unnecessary_cast)]
        Some(rl.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    None
}

/// The default cap on open connections: the open-file limit less a reserve
/// for the model files, the GPU driver and the listener (at most 16384).
pub fn default_max_connections(nofile: Option<u64>) -> usize {
    match nofile {
        Some(n) => (n.saturating_sub(256) as usize).clamp(16, 16384),
        None => 4096,
    }
}

const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 115\r\n\r\n{\"error\":{\"message\":\"too many open connections; retry later\",\"type\":\"server_overloaded\",\"param\":null,\"code\":\"503\"}}";

/// Serves `app` on `listener` until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    app: axum::Router,
    max_connections: usize,
    head_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(max_connections));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = &mut shutdown => return Ok(()),
        };
        let mut stream = match accepted {
            Ok((s, _)) => s,
            // Out of descriptors or a connection reset before accept: wait a
            // moment rather than spin, and keep serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_millis(200), stream.write_all(REFUSED)).await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(head_timeout)
                .keep_alive(true);
            let _ = b.serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}
