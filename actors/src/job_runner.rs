//! JobRunnerActor: runs jobs (exports; retention archives; erasures; sinks'
//! backfills) claimed from the `jobs` table. A claim is a lease renewed
//! while the job runs; a job whose runner died is claimed again by any node
//! once its lease expires. The
//! terminal state, the pending-event marker and the outbox row are written
//! in one transaction, guarded by the claim, so each job ends exactly once.

use std::{collections::HashSet, sync::Arc, time::Instant};

use chrono::Duration;
use fastack_core::{
    Config,
    clock::SharedClock,
    crypto::Keys,
    erasure, export, jobs,
    objects::Objects,
    retention,
    store::{Emit, Store},
};
use fastack_entities::{Job, JobId, JobKind, NodeId};
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
                    let Some(job) = claim(&ctx.store, ctx.node_id, ctx.now(), None).await? else {
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

/// The next runnable job (of `kind`, or of any), claimed by `node` for
/// [`claim_ttl`].
async fn claim(
    store: &Store,
    node: NodeId,
    now: chrono::DateTime<chrono::Utc>,
    kind: Option<JobKind>,
) -> fastack_core::Result<Option<Job>> {
    store.jobs().claim(node, now, claim_ttl(), kind).await
}

/// What a command running jobs in the foreground is told of each (its
/// progress bar, or its lines).
pub trait Watch: Sync {
    /// A job was claimed and starts.
    fn started(&self, job: &Job);
    /// The running job's progress, in its own unit.
    fn progress(&self, done: u64, total: u64);
    /// The job ended (as recorded, or as it stood when another runner took
    /// it over).
    fn ended(&self, job: &Job);
}

/// Claims the jobs of `kind` and runs them in this process, one after the
/// other, until none is left to claim: a node's runner in the foreground
/// (`fastack admin retention run`, `backfill`, `erasure request --here`),
/// with the same claim, renewal, attempts and recorded end. Returns the
/// jobs as they ended.
pub async fn run_here(
    env: &JobEnv<'_>,
    kind: JobKind,
    watch: &dyn Watch,
) -> fastack_core::Result<Vec<Job>> {
    let mut ended = Vec::new();
    while let Some(job) = claim(env.store, env.node, env.clock.now(), Some(kind)).await? {
        watch.started(&job);
        let (job, _) = run_claimed(env, job, &|done, total| watch.progress(done, total)).await;
        watch.ended(&job);
        ended.push(job);
    }
    Ok(ended)
}

/// Runs one claimed job to its terminal state and tells the node's sinks.
async fn run_job(ctx: &Arc<Ctx>, job: Job) {
    let env = JobEnv {
        store: &ctx.store,
        config: &ctx.config,
        objects: &ctx.objects,
        keys: &ctx.keys,
        clock: &ctx.clock,
        node: ctx.node_id,
        emit: &ctx.routing.jobs,
        erased: &ctx.routing.erased,
    };
    let id = job.id;
    // A line at every tenth of the way.
    let log = |done: u64, total: u64| {
        if done > 0 && total > 0 && done * 10 / total > (done - 1) * 10 / total {
            info!(job = %id, done, total, "job progress");
        }
    };
    let (_, recorded) = run_claimed(&env, job, &log).await;
    if recorded {
        ctx.signals.deliveries.raise();
        ctx.signals.outbox.raise();
    }
}

/// What running a job needs: a node's, or the command line's (which runs
/// retention and backfills in the foreground with a progress bar).
pub struct JobEnv<'a> {
    pub store: &'a Store,
    pub config: &'a Config,
    pub objects: &'a Objects,
    pub keys: &'a Keys,
    pub clock: &'a SharedClock,
    /// Who holds the claim.
    pub node: NodeId,
    /// The sinks of jobs' terminal events.
    pub emit: &'a Emit,
    /// The sinks of `core.contact.erased`.
    pub erased: &'a Emit,
}

/// A job's progress: (done, total) in its own unit (rows, hours).
pub type Progress<'p> = &'p (dyn Fn(u64, u64) + Sync);

/// Runs a job `env.node` claimed to its end, wherever it was claimed: the
/// claim is renewed while it runs, a job that started [`MAX_ATTEMPTS`]
/// times is failed, and the terminal state with its event is written
/// (retried briefly), only while the claim is still this runner's. Returns
/// the job as it ended and whether this runner recorded the end.
pub async fn run_claimed(env: &JobEnv<'_>, mut job: Job, progress: Progress<'_>) -> (Job, bool) {
    let started = Instant::now();
    info!(job = %job.id, kind = %job.kind, attempt = job.attempts, "job started");
    // Keep the claim alive while the job runs.
    let heartbeat = {
        let (store, clock, node, id) = (env.store.clone(), env.clock.clone(), env.node, job.id);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                match store
                    .jobs()
                    .renew_claim(id, node, clock.now() + claim_ttl())
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
        work(env, &job, progress).await
    };
    heartbeat.abort();
    jobs::conclude(&mut job, outcome, env.clock.now(), started.elapsed());
    let recorded = finish(env, &job).await;
    (job, recorded)
}

/// The work of the job's kind.
async fn work(env: &JobEnv<'_>, job: &Job, progress: Progress<'_>) -> Result<Value, String> {
    match job.kind {
        JobKind::Export => export::run(env.store, env.objects, env.keys, job)
            .await
            .map_err(|e| jobs::error_chain(&e)),
        JobKind::Retention => {
            let key = retention::job_partition(job).map_err(|e| jobs::error_chain(&e))?;
            let report = retention::archive_and_drop(
                env.store.as_ref(),
                env.objects,
                key,
                job.id,
                true,
                progress,
            )
            .await
            .map_err(|e| jobs::error_chain(&e))?;
            info!(partition = %report.partition, rows = report.manifest.rows, path = %report.path, "partition archived, verified and dropped");
            Ok(report.result_json())
        }
        JobKind::Backfill => {
            crate::sinks::run_backfill(env.store.as_ref(), env.config, job, progress).await
        }
        JobKind::Erasure => {
            let lake = match crate::sinks::lake(env.config) {
                Some(Ok(lake)) => Some(lake),
                Some(Err(e)) => return Err(jobs::error_chain(&e)),
                None => None,
            };
            let clock = env.clock.clone();
            let now = move || clock.now();
            let erasure = erasure::Env {
                store: env.store.as_ref(),
                objects: env.objects,
                keys: env.keys,
                lake: lake.as_ref().map(|l| l.files.as_ref()),
                now: &now,
                progress,
            };
            erasure::run(&erasure, job)
                .await
                .map_err(|e| jobs::error_chain(&e))
        }
    }
}

/// Writes the terminal state (with marker and outbox row); returns whether
/// it did. Retries briefly: the job's claim outlives a short database blip.
async fn finish(env: &JobEnv<'_>, job: &Job) -> bool {
    for attempt in 0..5u32 {
        let ended = match job.kind {
            // Its holds are lifted and its event written with its end.
            JobKind::Erasure => {
                erasure::finish(env.store.as_ref(), job, env.node, env.emit, env.erased).await
            }
            _ => env.store.jobs().finish(job, env.node, env.emit).await,
        };
        match ended {
            Ok(true) => {
                info!(job = %job.id, status = %job.status, "job finished");
                return true;
            }
            Ok(false) => {
                warn!(job = %job.id, "job was taken over by another runner; not finishing it here");
                return false;
            }
            Err(error) => {
                warn!(job = %job.id, %error, attempt, "could not record the job's end");
                tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
            }
        }
    }
    false
}
