//! Connections: the accept loop under a cap on open connections, set below
//! the open-file limit so that descriptors never run out. At the cap, the
//! connection idle longest (no request in progress: never sent one, or
//! between keep-alive requests) is closed to make room, so a new client is
//! answered however many idle sockets others hold; only when every
//! connection is busy does the newcomer get a 503, closed at once. HTTP/1.1
//! with a deadline for each request head — which closes connections that
//! send nothing, send headers slowly or sit idle between keep-alive requests
//! — and the soft open-file limit raised to the hard one at start.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use hyper::body::{Frame, SizeHint};
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

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

/// One open connection, as the accept loop sees it.
struct Conn {
    /// Requests whose response has not finished.
    busy: AtomicUsize,
    /// When it last became idle (or connected).
    idle_since: Mutex<Instant>,
    closing: AtomicBool,
    close: Notify,
    /// Where its slot goes when it closes: to the connection that asked it
    /// to close (straight, so that no other newcomer takes it meanwhile).
    handoff: Mutex<Option<oneshot::Sender<OwnedSemaphorePermit>>>,
}

/// The open connections.
#[derive(Default)]
struct Conns {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Conns {
    fn add(&self) -> (u64, Arc<Conn>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let c = Arc::new(Conn {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            closing: AtomicBool::new(false),
            close: Notify::new(),
            handoff: Mutex::new(None),
        });
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, c.clone());
        (id, c)
    }

    fn remove(&self, id: u64) {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Shutting down: every connection closes once its request in progress
    /// (if any) has been answered; returns when all have, or at `timeout`.
    async fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = {
                let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
                for c in open.values() {
                    if !c.closing.swap(true, Ordering::AcqRel) {
                        c.close.notify_one();
                    }
                }
                open.len()
            };
            if left == 0 || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asks the connection idle longest to close; its slot will come through
    /// the receiver. None where no connection is idle.
    fn close_oldest_idle(&self) -> Option<oneshot::Receiver<OwnedSemaphorePermit>> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0 && !c.closing.load(Ordering::Acquire))
            .min_by_key(|c| *c.idle_since.lock().unwrap_or_else(|e| e.into_inner()))?;
        let (tx, rx) = oneshot::channel();
        *oldest.handoff.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        oldest.closing.store(true, Ordering::Release);
        oldest.close.notify_one();
        Some(rx)
    }
}

/// Marks a connection busy from a request's arrival until its response body
/// is done (or dropped).
struct Busy(Arc<Conn>);

impl Busy {
    fn enter(c: &Arc<Conn>) -> Self {
        c.busy.fetch_add(1, Ordering::AcqRel);
        Self(c.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy while it streams.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves one connection until it ends, or until the accept loop asks it to
/// close (it then finishes the request in progress, if any).
async fn serve_conn(
    stream: TcpStream,
    permit: OwnedSemaphorePermit,
    app: axum::Router,
    conns: Arc<Conns>,
    head_timeout: Duration,
) {
    let (id, me) = conns.add();
    let _ = stream.set_nodelay(true);
    let inner = TowerToHyperService::new(app);
    let tracker = me.clone();
    let svc = hyper::service::service_fn(move |req| {
        let busy = Busy::enter(&tracker);
        let fut = inner.call(req);
        async move {
            let resp = fut.await?;
            Ok::<_, Infallible>(resp.map(|b| Body::new(Tracked { inner: b, _busy: busy })))
        }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .keep_alive(true);
    let conn = b.serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = me.close.notified() => {
            // Idle: dropped, which closes it at once (hyper's graceful
            // shutdown waits for a first request on a connection that never
            // sent one). A request that came in meanwhile is finished first.
            if me.busy.load(Ordering::Acquire) > 0 {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
    conns.remove(id);
    let to = me.handoff.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(to) = to {
        // The newcomer gave up waiting: the slot goes back to the pool.
        let _ = to.send(permit);
    }
}

/// Answers a connection past the cap with a 503 and closes it, reading what
/// the client sent for a moment first (closing on unread data would reset the
/// connection, and the client could lose the answer).
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_millis(300), async {
        stream.write_all(REFUSED).await?;
        stream.shutdown().await?;
        let mut buf = [0u8; 4096];
        while stream.read(&mut buf).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, lets the requests in progress finish (for at most
/// `drain_timeout`) and closes every connection.
pub async fn run(
    listener: TcpListener,
    app: axum::Router,
    max_connections: usize,
    head_timeout: Duration,
    drain_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(max_connections));
    let conns = Arc::new(Conns::default());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = &mut shutdown => {
                drop(listener);
                conns.drain(drain_timeout).await;
                return Ok(());
            }
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            // Out of descriptors or a connection reset before accept: wait a
            // moment rather than spin, and keep serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let (app, conns) = (app.clone(), conns.clone());
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(serve_conn(stream, permit, app, conns, head_timeout));
            }
            // At the cap: the longest idle connection makes room.
            Err(_) => match conns.close_oldest_idle() {
                Some(slot) => {
                    tokio::spawn(async move {
                        match tokio::time::timeout(Duration::from_secs(5), slot).await {
                            Ok(Ok(permit)) => serve_conn(stream, permit, app, conns, head_timeout).await,
                            _ => refuse(stream).await,
                        }
                    });
                }
                None => {
                    tokio::spawn(refuse(stream));
                }
            },
        }
    }
}
