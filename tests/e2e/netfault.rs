//! A TCP proxy the tests own, put between a node and a dependency
//! (PostgreSQL, RabbitMQ) to make the link misbehave on demand: added
//! latency each way, every connection reset at once (RST, as when a
//! middlebox or the server drops them), a blackhole — nothing crosses in
//! either direction and new connections are accepted but go nowhere, until
//! it is lifted; what was held then flows on, as a TCP peer's
//! retransmissions would deliver it once a partition heals — or the
//! dependency gone (connections reset, new ones refused).

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
};

/// What the link does now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Mode {
    /// Delay of every chunk, each way.
    latency: Duration,
    /// Nothing crosses.
    blackhole: bool,
    /// Bumped to reset every open connection.
    resets: u64,
    /// New connections are closed at once.
    refuse: bool,
}

pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free local port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, watching) = watch::channel(Mode::default());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(link(client, upstream, watching.clone()));
            }
        });
        Proxy { addr, mode, task }
    }

    pub fn set_latency(&self, latency: Duration) {
        self.mode.send_modify(|m| m.latency = latency);
    }

    /// Resets every open connection (new ones go through).
    pub fn reset_all(&self) {
        self.mode.send_modify(|m| m.resets += 1);
    }

    pub fn blackhole(&self, on: bool) {
        self.mode.send_modify(|m| m.blackhole = on);
    }

    /// The dependency "goes away": open connections are reset, new ones
    /// refused, until [`Proxy::restore`].
    pub fn cut(&self) {
        self.mode.send_modify(|m| {
            m.refuse = true;
            m.resets += 1;
        });
    }

    pub fn restore(&self) {
        self.mode.send_modify(|m| m.refuse = false);
    }

    /// The proxy's address as an AMQP URL (RabbitMQ's default account).
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the link lets bytes cross; `false` when the connection is
/// to be reset meanwhile.
async fn open(mode: &mut watch::Receiver<Mode>, born: u64) -> bool {
    mode.wait_for(|m| !m.blackhole || m.resets != born)
        .await
        .is_ok_and(|m| m.resets == born)
}

async fn link(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    let (born, refused) = {
        let m = mode.borrow();
        (m.resets, m.refuse)
    };
    if refused {
        let _ = client.set_zero_linger();
        return;
    }
    // A blackholed link takes the connection and says nothing.
    if !open(&mut mode, born).await {
        let _ = client.set_zero_linger();
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut up = tokio::spawn(pump(cr, sw, mode.clone(), born));
    let mut down = tokio::spawn(pump(sr, cw, mode.clone(), born));
    // Either side closing ends the link with an orderly close of the
    // other; a reset takes both sides down with RST (zero linger).
    let (first, second) = tokio::select! {
        ended = &mut up => (ended, down),
        ended = &mut down => (ended, up),
    };
    match first {
        Ok(End::Reset(r, w)) => {
            let Ok(End::Reset(r2, w2)) = second.await else {
                return;
            };
            for (r, w) in [(r, w2), (r2, w)] {
                if let Ok(stream) = r.reunite(w) {
                    let _ = stream.set_zero_linger();
                }
            }
        }
        _ => second.abort(),
    }
}

/// How a direction of a link ended.
enum End {
    Closed,
    /// Reset: the halves, to be dropped with zero linger.
    Reset(OwnedReadHalf, OwnedWriteHalf),
}

/// Copies one direction chunk by chunk, through the link's latency and
/// blackhole, until a side closes or the link is reset.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    born: u64,
) -> End {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !open(&mut mode, born).await {
            return End::Reset(from, to);
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return End::Closed,
                Ok(n) => n,
            },
            _ = mode.wait_for(|m| m.resets != born) => return End::Reset(from, to),
        };
        let latency = mode.borrow().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if !open(&mut mode, born).await {
            return End::Reset(from, to);
        }
        let written = tokio::select! {
            w = to.write_all(&buf[..n]) => w.is_ok(),
            _ = mode.wait_for(|m| m.resets != born) => return End::Reset(from, to),
        };
        if !written {
            return End::Closed;
        }
    }
}

/// The proxy's address as a PostgreSQL URL for the test database `name`.
pub fn pg_url_through(proxy: &Proxy, name: &str) -> String {
    format!("postgres://postgres@{}/{name}", proxy.addr)
}
