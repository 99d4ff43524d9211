//! Starting and stopping a node's HTTP side: the listeners around a
//! [`Runtime`] (which opens storage and starts the supervision tree). Used
//! by `fastack serve` and, in process, by the tests.

use std::{net::SocketAddr, sync::Arc};

use fastack_actors::Runtime;
use fastack_core::Config;
use poem::{EndpointExt, Route};
use poem_openapi::OpenApiService;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    Error, Result, VERSION,
    erasures::ErasuresApi,
    exports::ExportsApi,
    front_door::FrontDoor,
    gate::{gate, observe},
    listener::Limits,
    routes::CoreApi,
    state::{AppState, SharedState},
};

/// The OpenAPI service of the tenant API (no state needed to describe it).
pub fn openapi_service() -> OpenApiService<(CoreApi, ExportsApi, ErasuresApi), ()> {
    OpenApiService::new((CoreApi, ExportsApi, ErasuresApi), "fastack", VERSION)
        .description(
            "Event pipeline: send track/identify/batch events (202 once durable), \
             read events and contacts. Errors are RFC 9457 problem documents with a \
             stable `code`.",
        )
        .server("/")
}

/// The spec as served and committed in `openapi/openapi.json`.
pub fn openapi_json() -> String {
    crate::spec::close_request_schemas(&openapi_service().spec())
}

/// A running node.
pub struct Server {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    console_addr: Option<SocketAddr>,
    state: SharedState,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener, when `FASTACK_ADMIN_TOKEN` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The account console's listener, when `FASTACK_CONSOLE_LISTEN` is set.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console_addr
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// Stops accepting, lets in-flight requests finish, stops the actors.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            match task.await {
                Ok(Err(error)) => warn!(%error, "http server stopped with an error"),
                Err(error) => warn!(%error, "http server task failed"),
                Ok(Ok(())) => {}
            }
        }
        self.state.runtime.shutdown().await;
    }

    /// Runs until the HTTP server ends.
    pub async fn wait_for_stop_signal(self) {
        shutdown_signal().await;
        info!("shutting down");
        self.stop().await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// What a caller may inject when starting a node (tests: a manual clock,
/// object storage with faults, storage faults).
pub use fastack_actors::RuntimeOptions as StartOptions;

/// Binds the listeners first (a port in use fails before anything is
/// written), then opens the node ([`Runtime::open`]: storage, keys, Redis,
/// the actors) and serves.
pub async fn start(config: Config, options: StartOptions) -> Result<Server> {
    fastack_actors::sinks::check(&config)?;
    let listener = bind(config.listen, "FASTACK_LISTEN").await?;
    let admin_listener = match &config.admin_token {
        Some(_) => {
            if !config.admin_listen.ip().is_loopback() {
                warn!(addr = %config.admin_listen, "the admin listener is reachable beyond this machine; keep it on a private network");
            }
            Some(bind(config.admin_listen, "FASTACK_ADMIN_LISTEN").await?)
        }
        None => None,
    };
    let console_listener = match config.console_listen {
        Some(at) => Some(bind(at, "FASTACK_CONSOLE_LISTEN").await?),
        None => None,
    };
    let runtime = Runtime::open(&config, options).await?;
    let metrics = runtime.metrics().clone();
    let clock = runtime.clock().clone();
    // The document is generated once: served, and read for the gate's rules.
    let api = openapi_service();
    let (served, spec, docs) = crate::spec::documents(&api);
    let state: SharedState = Arc::new(AppState {
        keys: runtime.key_cache(config.key_cache_ttl),
        unauthenticated: fastack_core::ratelimit::ClientLimiter::new(config.unauth_rps),
        allow: crate::allow::AllowIndex::from_spec(&served),
        config: config.clone(),
        runtime,
        metrics: metrics.clone(),
        clock,
    });

    let app = FrontDoor {
        rest: Route::new()
            .nest("/", api)
            .at("/openapi.json", spec)
            .nest("/docs", docs),
    }
    .around(gate)
    .around(observe)
    .data(state.clone());

    let limits = Limits {
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
    };
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let addr = local_addr(&listener, config.listen, "FASTACK_LISTEN")?;
    tasks.push(tokio::spawn(crate::listener::serve(
        listener,
        app,
        limits,
        metrics.clone(),
        stopped.clone(),
    )));
    let admin_addr = match (admin_listener, &config.admin_token) {
        (Some(admin_listener), Some(token)) => {
            let a = local_addr(&admin_listener, config.admin_listen, "FASTACK_ADMIN_LISTEN")?;
            let admin = crate::admin::app(state.clone(), Arc::from(token.as_str()));
            tasks.push(tokio::spawn(crate::listener::serve(
                admin_listener,
                admin,
                limits,
                metrics.clone(),
                stopped.clone(),
            )));
            info!(addr = %a, "admin listener up");
            Some(a)
        }
        _ => None,
    };
    let console_addr = match (console_listener, config.console_listen) {
        (Some(console_listener), Some(at)) => {
            let a = local_addr(&console_listener, at, "FASTACK_CONSOLE_LISTEN")?;
            tasks.push(tokio::spawn(crate::listener::serve(
                console_listener,
                crate::console::app(state.clone()),
                limits,
                metrics,
                stopped,
            )));
            let url = config
                .console_url
                .clone()
                .unwrap_or_else(|| format!("http://{a}"));
            info!(addr = %a, %url, "account console up");
            Some(a)
        }
        _ => None,
    };
    info!(%addr, node = %config.node_id, embedded = config.is_embedded(), "fastack listening");
    Ok(Server {
        addr,
        admin_addr,
        console_addr,
        state,
        stop,
        tasks,
    })
}

async fn bind(at: SocketAddr, setting: &'static str) -> Result<TcpListener> {
    TcpListener::bind(at)
        .await
        .map_err(cannot_listen(at, setting))
}

fn local_addr(listener: &TcpListener, at: SocketAddr, setting: &'static str) -> Result<SocketAddr> {
    listener.local_addr().map_err(cannot_listen(at, setting))
}

fn cannot_listen(addr: SocketAddr, setting: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Bind {
        addr,
        setting,
        source,
    }
}
