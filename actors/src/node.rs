//! The one place a node's parts are built: storage, keys, object storage,
//! the clock and the routing of events to sinks. A serving node
//! ([`crate::Runtime::open`]) opens them here and starts its actors over
//! them; the command line's tools open the same parts for a node that
//! already exists, with no listener and no actor ([`Opening::Tool`]), so no
//! command wires storage, keys or routing itself.

use fastack_core::{
    Config,
    clock::SharedClock,
    crypto::Keys,
    health::{self, Dependency},
    objects::Objects,
    store::{self, Store},
};
use fastack_entities::NodeId;

use crate::{Result, RuntimeOptions, job_runner::JobEnv, sinks::Routing};

/// Why the parts are opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// A node that serves: the data directory and the database are created
    /// and migrated where missing, an empty database is bootstrapped (when
    /// `FASTACK_BOOTSTRAP` is on) and the partition window made.
    Serve,
    /// `fastack migrate`: created and migrated, the window made, nothing
    /// bootstrapped.
    Migrate,
    /// A tool run against an existing node's data (`fastack admin …`,
    /// `fastack keys …`): where no embedded database is, it fails with where
    /// it looked ([`fastack_core::Error::NoDatabase`]) and creates nothing.
    Tool,
}

/// A node's parts (see the module doc).
#[derive(Clone)]
pub struct NodeParts {
    pub config: Config,
    pub store: Store,
    pub keys: Keys,
    pub objects: Objects,
    pub clock: SharedClock,
    pub routing: Routing,
}

impl NodeParts {
    /// Opens the parts the configuration names; `options` may inject a
    /// clock and object storage (tests).
    pub async fn open(config: &Config, opening: Opening, options: &RuntimeOptions) -> Result<Self> {
        if config.is_embedded() {
            match opening {
                Opening::Serve | Opening::Migrate => {
                    fastack_core::owner_only::ensure_dir(&config.data_dir)?;
                }
                Opening::Tool => {
                    store::embedded_exists(config)?;
                }
            }
        }
        let store = store::open(config).await.map_err(|e| match e {
            // A database that answers and refuses a migration is not told
            // where to find it: its own error says what it refused.
            e @ fastack_core::Error::Migration(_) => e,
            e => {
                let location = match &config.database_url {
                    Some(url) if !config.is_embedded() => health::without_credentials(url),
                    _ => config.sqlite_path().display().to_string(),
                };
                health::unusable(Dependency::Database, &location, e)
            }
        })?;
        let clock = options.clock.clone();
        // After the store: a tool in a directory with no node never makes a
        // master key; and the key is checked against the one the store was
        // written with.
        let keys = fastack_core::keyring::open(store.as_ref(), config, clock.now()).await?;
        let objects = match &options.objects {
            Some(o) => o.clone(),
            None => Objects::from_config(config)?,
        };
        if opening == Opening::Serve && config.bootstrap {
            fastack_core::admin::bootstrap_node(store.as_ref(), config).await?;
        }
        if opening != Opening::Tool {
            fastack_core::retention::ensure_window(store.as_ref(), config, clock.now()).await?;
        }
        Ok(NodeParts {
            config: config.clone(),
            routing: Routing::for_config(config),
            store,
            keys,
            objects,
            clock,
        })
    }

    /// What a job needs to run, claimed by `node`.
    pub fn job_env(&self, node: NodeId) -> JobEnv<'_> {
        JobEnv {
            store: &self.store,
            config: &self.config,
            objects: &self.objects,
            keys: &self.keys,
            clock: &self.clock,
            node,
            emit: &self.routing.jobs,
            erased: &self.routing.erased,
        }
    }
}
