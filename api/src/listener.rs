//! The HTTP/1.1 server of fastack's listeners: hyper serving a poem
//! endpoint, with what poem's own server does not offer: a cap on open
//! connections, a header-read timeout and an idle keep-alive timeout.
//!
//! Each connection's socket is wrapped so reads know the connection's
//! phase:
//!
//! - **idle** (no request in flight, nothing of the next one received):
//!   closed after `idle_timeout` without traffic;
//! - **head** (bytes of a request arrived, its headers are not complete):
//!   closed `header_timeout` after its first byte, however slowly the
//!   rest trickles in;
//! - **request** (the handler runs): no socket deadline; a body must arrive
//!   within the body timeout, which the JSON extractor enforces (408).
//!
//! When the cap is reached the listener stops accepting; further clients
//! wait in the kernel's accept queue instead of exhausting descriptors.
//!
//! **A kept-alive connection is never closed without saying so.** HTTP/1.1
//! can reuse a connection only once the request's body has been read. When
//! a handler answers without reading it (a refusal: a wrong media type, an
//! unknown path, a bad key, a body too large), hyper tries to skip what is
//! left after the answer's head is already written; if the rest has not
//! arrived yet it closes the connection — after an answer that promised
//! keep-alive, so the client's next request on it goes unanswered. Here
//! every request body is [`Tracked`]: one dropped unread comes back to the
//! connection, which reads the rest (at most [`DRAIN_LIMIT`] bytes within
//! [`BODY_DRAIN_WAIT`]) before the answer goes out, or else marks the answer
//! `Connection: close`.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use fastack_core::metrics::Metrics;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use poem::{
    Endpoint, EndpointExt, IntoEndpoint,
    endpoint::{DynEndpoint, ToDynEndpoint},
    web::{LocalAddr, RemoteAddr},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    time::{Instant, Sleep},
};
use tracing::debug;

/// How a listener treats its connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

type App = dyn DynEndpoint<Output = poem::Response>;

/// How long a stopping listener lets requests in flight finish.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `stop` changes, then stops accepting
/// and lets open connections finish their requests (at most 10 s).
pub async fn serve<E>(
    listener: TcpListener,
    app: E,
    limits: Limits,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()>
where
    E: IntoEndpoint,
    E::Endpoint: 'static,
{
    let app: Arc<App> = Arc::new(ToDynEndpoint(app.into_endpoint().map_to_response()));
    let local = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                metrics.refused("connection_cap");
                tokio::select! {
                    p = slots.clone().acquire_owned() => p.map_err(io::Error::other)?,
                    _ = stop.changed() => break,
                }
            }
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of descriptors or a reset during the handshake:
                    // the listener itself is fine.
                    debug!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let metrics = metrics.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            connection(stream, local, remote, app, limits, metrics, stop).await;
            drop(permit);
        });
    }
    // Every connection holds a slot until it ends: wait for all of them.
    let all = limits.max_connections.min(u32::MAX as usize) as u32;
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, slots.acquire_many(all)).await;
    Ok(())
}

async fn connection(
    stream: TcpStream,
    local: SocketAddr,
    remote: SocketAddr,
    app: Arc<App>,
    limits: Limits,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let phase = Arc::new(Phase::new());
    let io = TimedIo {
        inner: stream,
        phase: phase.clone(),
        limits,
        metrics,
        deadline: Box::pin(tokio::time::sleep(limits.idle_timeout)),
    };
    let service = service_fn(move |req: poem::http::Request<Incoming>| {
        let app = app.clone();
        let phase = phase.clone();
        phase.begin();
        async move {
            let declared = declared_length(req.headers());
            let mut req = poem::Request::from((
                req,
                LocalAddr(local.into()),
                RemoteAddr(remote.into()),
                poem::http::uri::Scheme::HTTP,
            ));
            let unread = Tracked::install(&mut req, declared);
            let mut resp = app.get_response(req).await;
            // A body that timed out (408) is not waited for again.
            let timed_out = resp.status() == poem::http::StatusCode::REQUEST_TIMEOUT;
            if let Some(unread) = unread
                && (timed_out || !finish_body(&unread, declared).await)
            {
                resp.headers_mut().insert(
                    poem::http::header::CONNECTION,
                    poem::http::HeaderValue::from_static("close"),
                );
            }
            phase.end();
            Ok::<_, std::convert::Infallible>(hyper::Response::<_>::from(resp))
        }
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.changed() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Where a connection is between requests (see the module docs). Times
/// are microseconds since the connection opened, plus one (0: unset).
struct Phase {
    opened: Instant,
    in_flight: AtomicUsize,
    /// When the first byte of the next request arrived (head phase).
    head_started: AtomicU64,
    /// Last read or write: the idle timeout counts from here.
    last_activity: AtomicU64,
}

/// What a waiting read is timed against.
enum Deadline {
    /// Between requests: close at this instant.
    Idle(Instant),
    /// A request's headers are arriving: close at this instant.
    Head(Instant),
    /// A request is in flight: no limit, but look again then (hyper may not
    /// poll the read again when the request ends, and the idle deadline
    /// must still be armed).
    Recheck(Instant),
}

impl Phase {
    fn new() -> Self {
        Phase {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            head_started: AtomicU64::new(0),
            last_activity: AtomicU64::new(0),
        }
    }

    fn stamp(&self) -> u64 {
        self.opened.elapsed().as_micros() as u64 + 1
    }

    fn at(&self, stamp: u64) -> Instant {
        self.opened + Duration::from_micros(stamp.saturating_sub(1))
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
    }

    fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.touch();
    }

    fn touch(&self) {
        self.last_activity.store(self.stamp(), Ordering::Release);
    }

    /// Bytes arrived: between requests, they start the next one's head.
    fn received(&self) {
        let now = self.stamp();
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self
                .head_started
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        }
        self.last_activity.store(now, Ordering::Release);
    }

    /// What a read waiting now is timed against.
    fn deadline(&self, limits: &Limits) -> Deadline {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Deadline::Recheck(Instant::now() + limits.idle_timeout);
        }
        match self.head_started.load(Ordering::Acquire) {
            0 => {
                let since = self.last_activity.load(Ordering::Acquire);
                Deadline::Idle(self.at(since) + limits.idle_timeout)
            }
            started => Deadline::Head(self.at(started) + limits.header_timeout),
        }
    }
}

/// A socket that fails its reads once the phase's deadline has passed, so
/// hyper closes the connection.
struct TimedIo {
    inner: TcpStream,
    phase: Arc<Phase>,
    limits: Limits,
    metrics: Arc<Metrics>,
    /// Armed at the current deadline while a read waits.
    deadline: Pin<Box<Sleep>>,
}

impl AsyncRead for TimedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.phase.received();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                loop {
                    let (at, head) = match self.phase.deadline(&self.limits) {
                        Deadline::Idle(at) => (at, Some(false)),
                        Deadline::Head(at) => (at, Some(true)),
                        Deadline::Recheck(at) => (at, None),
                    };
                    if self.deadline.deadline() != at {
                        self.deadline.as_mut().reset(at);
                    }
                    if self.deadline.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let Some(head) = head else {
                        // A long request: look again later.
                        continue;
                    };
                    if head {
                        self.metrics.refused("header_timeout");
                    }
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        if head {
                            "request headers not received in time"
                        } else {
                            "idle connection"
                        },
                    )));
                }
            }
        }
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.phase.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.phase.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Request bodies left unread are read to their end, up to this many bytes,
/// before the answer (larger ones close the connection).
pub const DRAIN_LIMIT: u64 = 16 * 1024 * 1024;

/// How long the rest of an unread body may take to arrive once the answer
/// is ready (then the connection closes after the answer).
pub const BODY_DRAIN_WAIT: Duration = Duration::from_secs(5);

type BoxBody = http_body_util::combinators::BoxBody<bytes::Bytes, io::Error>;

/// Where a body dropped before its end is handed back.
type Unread = Arc<parking_lot::Mutex<Option<BoxBody>>>;

fn declared_length(headers: &poem::http::HeaderMap) -> Option<u64> {
    headers
        .get(poem::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// A request body that, dropped before its end, hands what is left back to
/// the connection (see the module docs).
struct Tracked {
    inner: Option<BoxBody>,
    unread: Unread,
    ended: bool,
}

impl Tracked {
    /// Wraps the body of `req` unless it has none; returns where an unread
    /// rest will be.
    fn install(req: &mut poem::Request, declared: Option<u64>) -> Option<Unread> {
        let chunked = req
            .headers()
            .contains_key(poem::http::header::TRANSFER_ENCODING);
        if declared.unwrap_or(0) == 0 && !chunked {
            return None;
        }
        let unread = Unread::default();
        let body = BoxBody::from(req.take_body());
        req.set_body(poem::Body::from(BoxBody::new(Tracked {
            inner: Some(body),
            unread: unread.clone(),
            ended: false,
        })));
        Some(unread)
    }
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = Pin::new(inner).poll_frame(cx);
        // The end, or a broken connection: nothing left to read either way.
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            self.ended = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take()
            && !self.ended
            && !http_body::Body::is_end_stream(&inner)
        {
            *self.unread.lock() = Some(inner);
        }
    }
}

/// Reads what the handler left of a request body; whether the connection
/// can be kept (everything read, in time).
async fn finish_body(unread: &Unread, declared: Option<u64>) -> bool {
    use http_body_util::BodyExt;
    let Some(rest) = unread.lock().take() else {
        return true;
    };
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return false;
    }
    let mut limited = http_body_util::Limited::new(rest, DRAIN_LIMIT as usize);
    let read_all = async {
        while let Some(frame) = limited.frame().await {
            if frame.is_err() {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(BODY_DRAIN_WAIT, read_all)
        .await
        .unwrap_or(false)
}
