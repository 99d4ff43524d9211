//! DependencyWatch: checks the node's dependencies every
//! `FASTACK_DEPENDENCY_CHECK_MS` (the database, object storage, the lake,
//! Redis, the data directory's disk) and records what it finds in the
//! node's [`Health`](fastack_core::health::Health), for `/readyz` and
//! `fastack_dependency_up`. RabbitMQ is recorded by its sink, which sees
//! the broker's answers. A failed check is a state, never an error of the
//! actor: ingestion goes on whatever is down.

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::{
    Config,
    health::{self, CHECK_TIMEOUT, Dependency, Health, LOW_DISK_BYTES},
    objects::Objects,
};
use ractor::ActorProcessingErr;

use crate::{context::Ctx, periodic::Periodic};

#[derive(Clone)]
pub struct DependencyWatch {
    /// The lake's storage and settings, when a sink keeping one is on.
    lake: Option<(Objects, &'static str)>,
}

impl DependencyWatch {
    pub fn new(config: &Config) -> Self {
        DependencyWatch {
            lake: crate::sinks::lake(config)
                .and_then(Result::ok)
                .map(|lake| (lake.objects, lake.settings)),
        }
    }
}

/// The data directory's free space: a metric, and a warning when low.
pub fn disk(config: &Config, health: &Health) {
    let dir = &config.data_dir;
    match health::free_bytes(dir) {
        Ok(free) => {
            health.free_bytes(free);
            let detail = Some(format!("{} bytes free under {}", free, dir.display()));
            if free < LOW_DISK_BYTES {
                health.set(
                    Dependency::Disk,
                    health::State::Warning,
                    detail,
                    Some(format!(
                        "less than {} MiB free on the data directory's disk",
                        LOW_DISK_BYTES >> 20
                    )),
                );
            } else {
                health.up(Dependency::Disk, detail);
            }
        }
        Err(e) => health.down(Dependency::Disk, e),
    }
}

#[async_trait]
impl Periodic for DependencyWatch {
    const NAME: &'static str = "dependency_watch";

    fn every(&self, ctx: &Ctx) -> Duration {
        ctx.config.dependency_check
    }

    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr> {
        let health = &ctx.health;
        match tokio::time::timeout(CHECK_TIMEOUT, ctx.store.ping()).await {
            Ok(Ok(())) => health.up(Dependency::Database, None),
            Ok(Err(e)) => health.down(Dependency::Database, e),
            Err(_) => health.down(Dependency::Database, "did not answer in time"),
        }
        let node = ctx.node_id.to_string();
        let stores = std::iter::once((Dependency::ObjectStorage, &ctx.objects)).chain(
            self.lake
                .iter()
                .map(|(l, settings)| (Dependency::Lake(settings), l)),
        );
        for (dep, objects) in stores {
            match health::probe_objects(objects, &node).await {
                Ok(()) => health.up(dep, Some(objects.location.clone())),
                Err(e) => health.down(dep, e),
            }
        }
        if let Some(redis) = &ctx.redis_limiter {
            match tokio::time::timeout(CHECK_TIMEOUT, redis.ping()).await {
                Ok(Ok(())) => health.up(Dependency::Redis, None),
                Ok(Err(e)) => health.down(Dependency::Redis, e),
                Err(_) => health.down(Dependency::Redis, "did not answer in time"),
            }
        }
        disk(&ctx.config, health);
        Ok(())
    }
}
