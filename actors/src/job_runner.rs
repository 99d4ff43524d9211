//! JobRunnerActor: runs jobs (exports; retention archives; mirror
//! backfills) claimed from the `jobs` table. A claim is a lease renewed
//! while the job runs; a job whose runner died is claimed again by any node
//! once its lease expires. The
//! terminal state, the pending-event marker and the outbox row are written
//! in one transaction, guarded by the claim, so each job ends exactly once.

use std::{collections::HashSet, sync::Arc, time::Instant};

use chrono::Duration;
use fastack_core::{export, jobs, retention};
use fastack_entities::{Job, JobId, JobKind};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::Value;
use tracing::{info, warn};

use crate::{context::Ctx, signal::Wakes};

/// Runs started before a job is failed for good (a job that kills its node
/// must not loop forever).
pub const MAX_ATTEMPTS: u32 = 3;

pub struct JobRunnerActor;

pub struct JobRunnerArgs {
    pub ctx: Arc<Ctx>,
}

pub struct JobRunnerState {
    ctx: Arc<Ctx>,
    running: HashSet<JobId>,
    /// Its timer and signal, stopped with the state.
    wakes: Option<Wakes>,
}

/// Messages of the job runner.
#[derive(Debug)]
pub enum JobRunnerMsg {
    /// Claim runnable jobs up to the concurrency limit.
    Poll,
    /// A job's task ended (whatever its outcome).
    Finished { job: JobId },
}

fn claim_ttl() -> Duration {
    Duration::seconds(30)
}

impl Actor for JobRunnerActor {
    type Msg = JobRunnerMsg;
    type State = JobRunnerState;
    type Arguments = JobRunnerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(JobRunnerState {
            ctx: args.ctx,
            running: HashSet::new(),
            wakes: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.wakes = Some(Wakes::start(
            &myself,
            state.ctx.config.poll_interval,
            Some(&state.ctx.signals.jobs),
            || JobRunnerMsg::Poll,
        ));
        myself.send_message(JobRunnerMsg::Poll)?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            JobRunnerMsg::Finished { job } => {
                state.running.remove(&job);
                myself.send_message(JobRunnerMsg::Poll)?;
            }
            JobRunnerMsg::Poll => {
                while state.running.len() < state.ctx.config.job_concurrency.max(1) {
                    let ctx = &state.ctx;
                    let Some(job) = ctx
                        .store
                        .claim_job(ctx.node_id, ctx.now(), claim_ttl(), None)
                        .await?
                    else {
                        break;
                    };
                    state.running.insert(job.id);
                    let ctx = ctx.clone();
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let id = job.id;
                        run_job(&ctx, job).await;
                        let _ = me.cast(JobRunnerMsg::Finished { job: id });
                    });
                }
            }
        }
        Ok(())
    }
}

/// Runs one claimed job to its terminal state.
async fn run_job(ctx: &Arc<Ctx>, mut job: Job) {
    let started = Instant::now();
    info!(job = %job.id, kind = %job.kind, attempt = job.attempts, "job started");
    // Keep the claim alive while the job runs.
    let heartbeat = {
        let ctx = ctx.clone();
        let id = job.id;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                match ctx
                    .store
                    .renew_job_claim(id, ctx.node_id, ctx.now() + claim_ttl())
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(error) => warn!(job = %id, %error, "could not renew job claim"),
                }
            }
        })
    };
    let outcome = if job.attempts > MAX_ATTEMPTS {
        Err(format!("gave up after {MAX_ATTEMPTS} attempts"))
    } else {
        match job.kind {
            JobKind::Export => export::run(&ctx.store, &ctx.objects, &ctx.keys, &job)
                .await
                .map_err(|e| jobs::error_chain(&e)),
            JobKind::Retention => run_retention(ctx, &job)
                .await
                .map_err(|e| jobs::error_chain(&e)),
            JobKind::Backfill => {
                let id = job.id;
                crate::sinks::mirror::backfill(
                    ctx.store.as_ref(),
                    &ctx.config,
                    &job,
                    &|done, total| {
                        if done > 0 && done % 24 == 0 {
                            info!(job = %id, hours = done, of = total, "backfilling the mirror");
                        }
                    },
                )
                .await
            }
        }
    };
    heartbeat.abort();
    jobs::conclude(&mut job, outcome, ctx.now(), started.elapsed());
    finish(ctx, &job).await;
}

/// Archives, verifies and drops the job's partition.
async fn run_retention(ctx: &Ctx, job: &Job) -> fastack_core::Result<Value> {
    let key = retention::job_partition(job)?;
    let table = key.table_name();
    let report = retention::archive_and_drop(
        ctx.store.as_ref(),
        &ctx.objects,
        key,
        job.id,
        true,
        &|done, total| {
            if done % 100_000 == 0 && done > 0 {
                info!(partition = %table, done, total, "archiving");
            }
        },
    )
    .await?;
    info!(partition = %report.partition, rows = report.manifest.rows, path = %report.path, "partition archived, verified and dropped");
    Ok(report.result_json())
}

/// Writes the terminal state (with marker and outbox row) and kicks the
/// relay. Retries briefly: the job's claim outlives a short database blip.
pub async fn finish(ctx: &Ctx, job: &Job) {
    for attempt in 0..5u32 {
        match ctx
            .store
            .finish_job(job, ctx.node_id, &ctx.routing.jobs)
            .await
        {
            Ok(true) => {
                info!(job = %job.id, status = %job.status, "job finished");
                ctx.signals.deliveries.raise();
                ctx.signals.outbox.raise();
                return;
            }
            Ok(false) => {
                warn!(job = %job.id, "job was taken over by another runner; not finishing it here");
                return;
            }
            Err(error) => {
                warn!(job = %job.id, %error, attempt, "could not record the job's end");
                tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}
