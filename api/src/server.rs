//! Starting and stopping a node: storage, the supervision tree, the HTTP
//! listener. Used by `fastack serve` and, in process, by the tests.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use fastack_actors::Runtime;
use fastack_core::{
    Config, admin, auth::KeyCache, clock::SharedClock, crypto::Keys, metrics::Metrics,
    objects::Objects, ratelimit::RedisLimiter, store,
};
use poem::{
    EndpointExt, Route,
    listener::{Acceptor, Listener, TcpListener},
};
use poem_openapi::OpenApiService;
use tokio::{sync::oneshot, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    Error, Result,
    gate::{gate, observe},
    jobs::JobsApi,
    routes::CoreApi,
    state::{AppState, SharedState},
};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The OpenAPI service of the tenant API (no state needed to describe it).
pub fn openapi_service() -> OpenApiService<(CoreApi, JobsApi), ()> {
    OpenApiService::new((CoreApi, JobsApi), "fastack", VERSION)
        .description(
            "Event pipeline: send track/identify/batch events (202 once durable), \
             read events and contacts. Errors are RFC 9457 problem documents with a \
             stable `code`.",
        )
        .server("/")
}

/// The spec as committed in `openapi/openapi.json`.
pub fn openapi_json() -> String {
    openapi_service().spec()
}

/// A running node.
pub struct Server {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    state: SharedState,
    shutdown: Vec<oneshot::Sender<()>>,
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

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// Stops accepting, lets in-flight requests finish, stops the actors.
    pub async fn stop(mut self) {
        for tx in self.shutdown.drain(..) {
            let _ = tx.send(());
        }
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

/// Writes the bootstrap key readable by its owner only.
fn write_secret_file(path: &Path, secret: &str) -> Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .map_err(|e| fastack_core::Error::io(path.display().to_string(), e))?;
    file.write_all(format!("{secret}\n").as_bytes())
        .map_err(|e| fastack_core::Error::io(path.display().to_string(), e))?;
    Ok(())
}

/// What a caller may inject when starting a node (tests: a manual clock,
/// object storage with faults).
pub struct StartOptions {
    pub clock: SharedClock,
    pub objects: Option<Objects>,
}

impl Default for StartOptions {
    fn default() -> Self {
        StartOptions {
            clock: fastack_core::clock::system(),
            objects: None,
        }
    }
}

/// Opens storage (migrating it), bootstraps an empty embedded database,
/// starts the actors and binds the listener.
pub async fn start(config: Config, options: StartOptions) -> Result<Server> {
    let clock = options.clock;
    if config.is_embedded() {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| fastack_core::Error::io(config.data_dir.display().to_string(), e))?;
    }
    config.check_streaming()?;
    let keys = Keys::load(&config)?;
    let objects = match options.objects {
        Some(o) => o,
        None => Objects::from_config(&config)?,
    };
    let store = store::open(&config).await?;
    if config.is_embedded()
        && config.bootstrap
        && let Some((tenant, key)) = admin::bootstrap(store.as_ref()).await?
    {
        let path = config.data_dir.join("bootstrap-key");
        write_secret_file(&path, &key.secret)?;
        info!(tenant = %tenant.id, path = %path.display(), "created tenant `default`; its API key is in the bootstrap-key file");
    }
    fastack_core::retention::ensure_window(store.as_ref(), &config, clock.now()).await?;
    let metrics = Arc::new(Metrics::new());
    let redis_limiter = match &config.redis_url {
        Some(url) => Some(
            RedisLimiter::connect(
                url,
                &config.redis_prefix,
                metrics.ratelimit_round_trips.clone(),
            )
            .await?,
        ),
        None => None,
    };
    if config.amqp_url.is_none() {
        info!("event streaming is off (no FASTACK_AMQP_URL): webhooks and polling still work");
    }
    let runtime = Runtime::start(
        config.clone(),
        store.clone(),
        clock.clone(),
        metrics.clone(),
        redis_limiter,
        keys,
        objects,
    )
    .await?;
    let state: SharedState = Arc::new(AppState {
        keys: KeyCache::new(store.clone(), config.key_cache_ttl),
        config: config.clone(),
        store,
        runtime,
        metrics,
        clock,
    });

    let api = openapi_service();
    let spec = api.spec_endpoint();
    let docs = api.swagger_ui();
    let app = Route::new()
        .nest("/", api)
        .at("/openapi.json", spec)
        .nest("/docs", docs)
        .around(gate)
        .around(observe)
        .data(state.clone());

    let mut shutdown = Vec::new();
    let mut tasks = Vec::new();
    let addr = serve(config.listen, app, &mut shutdown, &mut tasks).await?;
    let admin_addr = match &config.admin_token {
        Some(token) => {
            let admin = crate::admin::app(state.clone(), Arc::from(token.as_str()));
            let a = serve(config.admin_listen, admin, &mut shutdown, &mut tasks).await?;
            info!(addr = %a, "admin listener up");
            Some(a)
        }
        None => None,
    };
    info!(%addr, node = %config.node_id, embedded = config.is_embedded(), "fastack listening");
    Ok(Server {
        addr,
        admin_addr,
        state,
        shutdown,
        tasks,
    })
}

/// Binds `at` and serves `app` until told to stop.
async fn serve(
    at: SocketAddr,
    app: impl poem::Endpoint + 'static,
    shutdown: &mut Vec<oneshot::Sender<()>>,
    tasks: &mut Vec<JoinHandle<std::io::Result<()>>>,
) -> Result<SocketAddr> {
    let acceptor = TcpListener::bind(at)
        .into_acceptor()
        .await
        .map_err(|source| Error::Bind { addr: at, source })?;
    let addr = acceptor
        .local_addr()
        .first()
        .and_then(|a| a.as_socket_addr().copied())
        .ok_or(Error::Bind {
            addr: at,
            source: std::io::Error::other("listener has no socket address"),
        })?;
    let (tx, rx) = oneshot::channel::<()>();
    tasks.push(tokio::spawn(async move {
        poem::Server::new_with_acceptor(acceptor)
            .run_with_graceful_shutdown(
                app,
                async move {
                    let _ = rx.await;
                },
                Some(Duration::from_secs(10)),
            )
            .await
    }));
    shutdown.push(tx);
    Ok(addr)
}
