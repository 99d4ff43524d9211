//! The durable half of the fast-ack path: a group commit.
//!
//! Requests of all tenants queue in [`IngestQueue`] (`ingest_queue.rs`). The
//! writer takes
//! whatever has accumulated (up to `ingest_max_rows`), records idempotency
//! keys and inbox rows in one transaction, and only after the commit answers
//! each request through its reply port. One fsync serves every request that
//! arrived while the previous commit was running, so a hot tenant is never
//! serialised behind one fsync per request.
//!
//! The queue belongs to the node, not to the actor: when the writer is
//! restarted by its supervisor, requests already queued are still there
//! (the mailbox is kept). A request in a commit that fails is answered with
//! an error (the client retries; nothing was acknowledged).
//!
//! Every request carries the deadline of its answer. A group commits under
//! the earliest deadline of its requests: the store refuses to commit past
//! it ([`fastack_core::store::Ingest::commit`]), and the writer stops
//! waiting for the store a moment after it ([`COMMIT_GRACE`]) and answers
//! the group `503`. A request whose deadline passed while it queued is
//! answered `503` without a commit. So a database that stops answering
//! costs a request its budget, never the length of the outage.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use fastack_core::store::{Fence, IngestRow};
use fastack_entities::{EventId, TenantId};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, warn};

use crate::context::Ctx;

pub use crate::ingest_queue::{
    COMMIT_GRACE, IngestError, IngestQueue, IngestReply, IngestRequest, ItemOutcome,
};

pub struct IngestWriterActor;

pub struct IngestWriterArgs {
    pub ctx: Arc<Ctx>,
}

pub struct IngestWriterState {
    ctx: Arc<Ctx>,
    /// Group commits allowed in flight at once.
    slots: Arc<Semaphore>,
    max_slots: usize,
    /// Signalled when a group commit ends.
    committed: Arc<Notify>,
}

/// The writer's own messages.
#[derive(Debug)]
pub enum IngestWriterMsg {
    /// Take the next group from the queue and commit it.
    Drain,
}

impl Actor for IngestWriterActor {
    type Msg = IngestWriterMsg;
    type State = IngestWriterState;
    type Arguments = IngestWriterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // On PostgreSQL a second commit in flight pays off once a group's
        // worth of rows waits; a handful of rows is cheaper merged into the
        // next group, so commits beyond the first wait for
        // `ingest_split_rows` queued rows (see `Drain`). SQLite has one
        // writer thread, which runs groups one after another; a second
        // group queued behind the one committing starts the moment it
        // ends, instead of after the answer has come back here and the
        // next group has been gathered (8 % more `track` requests a
        // second, benches/HISTORY.md).
        let concurrency = args
            .ctx
            .config
            .ingest_concurrency
            .unwrap_or(match args.ctx.store.backend() {
                fastack_core::store::Backend::Postgres => std::thread::available_parallelism()
                    .map_or(1, |n| n.get() / 2)
                    .clamp(2, 4),
                fastack_core::store::Backend::Sqlite => 2,
            })
            .max(1);
        myself.send_message(IngestWriterMsg::Drain)?;
        Ok(IngestWriterState {
            ctx: args.ctx,
            slots: Arc::new(Semaphore::new(concurrency)),
            max_slots: concurrency,
            committed: Arc::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            IngestWriterMsg::Drain => {
                let permit = state.slots.clone().acquire_owned().await?;
                wait_for_split(state).await;
                let max_rows = state.ctx.config.ingest_max_rows;
                let batch = {
                    let mut rx = state.ctx.ingest.rx.lock().await;
                    // Wake up now and then so stop signals are handled.
                    match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
                        Err(_) => None,
                        Ok(None) => {
                            myself.stop(Some("ingest queue closed".to_owned()));
                            return Ok(());
                        }
                        Ok(Some(first)) => {
                            let mut rows = first.rows.len();
                            let mut batch = vec![first];
                            while rows < max_rows {
                                match rx.try_recv() {
                                    Ok(next) => {
                                        rows += next.rows.len();
                                        batch.push(next);
                                    }
                                    Err(_) => break,
                                }
                            }
                            state.ctx.ingest.taken(rows);
                            Some(batch)
                        }
                    }
                };
                if let Some(batch) = batch {
                    state
                        .ctx
                        .metrics
                        .ingest_queue_depth
                        .set(state.ctx.ingest.depth() as i64);
                    let ctx = state.ctx.clone();
                    let committed = state.committed.clone();
                    tokio::spawn(async move {
                        let deferred = flush(&ctx, batch).await;
                        drop(permit);
                        committed.notify_one();
                        for request in deferred {
                            if ctx.ingest.enqueue(request).await.is_err() {
                                warn!("ingest queue closed while re-queueing a deferred request");
                            }
                        }
                    });
                }
                myself.send_message(IngestWriterMsg::Drain)?;
            }
        }
        Ok(())
    }
}

/// Holding a slot while other commits are in flight: waits until enough
/// rows are queued to be worth a commit of their own, or until no other
/// commit is in flight (then the rows make the next group anyway).
async fn wait_for_split(state: &IngestWriterState) {
    let queue = &state.ctx.ingest;
    loop {
        let others = state.max_slots - state.slots.available_permits() - 1;
        if others == 0 || queue.queued_rows() >= queue.split_rows {
            return;
        }
        tokio::select! {
            _ = state.committed.notified() => {}
            _ = queue.split_ready.notified() => {}
            // Now and then, so stop signals are handled.
            _ = tokio::time::sleep(Duration::from_millis(100)) => return,
        }
    }
}

/// Where a request's rows landed in the flat row list of a group.
enum Placement {
    /// Rows `start..start + len` of the group.
    Owner { start: usize },
    /// A single-row request whose key another request of the group owns.
    Dependent { owner_row: usize },
}

/// Commits one group. Returns requests to retry in the next group (they
/// collided with a request that was rejected).
///
/// When the database refuses the group because of values in it (a
/// constraint, a value it cannot store), the fault belongs to one request,
/// not to the group: the group is split in halves and each committed on its
/// own, down to the one request that is refused alone. One tenant's bad row
/// never fails another tenant's request.
async fn flush(ctx: &Ctx, requests: Vec<IngestRequest>) -> Vec<IngestRequest> {
    let started = Instant::now();
    // Requests whose answer is already due get it without a commit.
    let (mut requests, late): (Vec<_>, Vec<_>) =
        requests.into_iter().partition(|r| r.deadline > started);
    if !late.is_empty() {
        ctx.metrics.ingest_deadline_missed.inc_by(late.len() as u64);
        for request in late {
            request.reply.send(Err(IngestError::Unavailable)).ok();
        }
    }
    let Some(deadline) = requests.iter().map(|r| r.deadline).min() else {
        return Vec::new();
    };
    let mut rows: Vec<IngestRow> = Vec::new();
    let mut row_request: Vec<usize> = Vec::new();
    let mut owners: HashMap<(TenantId, String), usize> = HashMap::new();
    let mut placement: Vec<Option<Placement>> = Vec::with_capacity(requests.len());
    let mut deferred_idx: Vec<usize> = Vec::new();

    for (ri, request) in requests.iter_mut().enumerate() {
        let collides = request.rows.iter().find_map(|r| {
            owners
                .get(&(r.tenant_id, r.idempotency_key.clone()))
                .copied()
        });
        match collides {
            None => {
                let start = rows.len();
                for row in request.rows.drain(..) {
                    owners.insert((row.tenant_id, row.idempotency_key.clone()), rows.len());
                    row_request.push(ri);
                    rows.push(row);
                }
                placement.push(Some(Placement::Owner { start }));
            }
            Some(owner_row) if request.rows.len() == 1 => {
                placement.push(Some(Placement::Dependent { owner_row }));
            }
            Some(_) => {
                // A batch colliding with another request of this group waits
                // for the next group, so all-or-nothing holds for both.
                placement.push(None);
                deferred_idx.push(ri);
            }
        }
    }
    // A request is rejected when any of its rows hits an existing key with
    // a different fingerprint.
    let rejected_of = |fences: &[Fence]| -> HashSet<usize> {
        let mut rejected = HashSet::new();
        for (i, fence) in fences.iter().enumerate() {
            if let Fence::Taken { fingerprint, .. } = fence
                && *fingerprint != rows[i].fingerprint
            {
                rejected.insert(row_request[i]);
            }
        }
        rejected
    };
    let keep = |fences: &[Fence]| -> Vec<bool> {
        let rejected = rejected_of(fences);
        row_request.iter().map(|r| !rejected.contains(r)).collect()
    };

    let result = match ctx
        .faults
        .check_commit(rows.iter().map(|r| r.idempotency_key.as_str()))
    {
        Ok(()) => {
            let give_up = tokio::time::Instant::from_std(deadline + COMMIT_GRACE);
            tokio::time::timeout_at(give_up, ctx.store.ingest().commit(&rows, &keep, deadline))
                .await
                .unwrap_or(Err(fastack_core::Error::Deadline("the event store")))
        }
        Err(injected) => Err(injected),
    };
    ctx.metrics.group_commit_rows.observe(rows.len() as f64);
    ctx.metrics
        .group_commit_seconds
        .observe(started.elapsed().as_secs_f64());

    let fences = match result {
        Ok(f) => f,
        Err(error) if error.is_refusal() => {
            // Nothing of the group was committed: give each request its rows
            // back and find the one the database refuses.
            for (row, ri) in rows.into_iter().zip(row_request) {
                requests[ri].rows.push(row);
            }
            return isolate(ctx, requests, error).await;
        }
        Err(error) => {
            if matches!(error, fastack_core::Error::Deadline(_)) {
                ctx.metrics
                    .ingest_deadline_missed
                    .inc_by(requests.len() as u64);
            }
            warn!(op = "group commit", %error, rows = rows.len(), "group commit failed; nothing of it was accepted");
            // Deferred requests are answered too: the client retries and the
            // fence keeps the retry exact.
            for request in requests {
                request.reply.send(Err(IngestError::Unavailable)).ok();
            }
            return Vec::new();
        }
    };
    let rejected = rejected_of(&fences);

    // Owner rows: effective (id, fingerprint) of each key after the commit.
    let effective = |i: usize| -> (ItemOutcome, [u8; 32]) {
        match &fences[i] {
            Fence::Fresh => (ItemOutcome::Accepted(rows[i].event_id), rows[i].fingerprint),
            Fence::Taken {
                event_id,
                fingerprint,
            } => (ItemOutcome::Duplicate(*event_id), *fingerprint),
        }
    };

    let mut woken: HashSet<TenantId> = HashSet::new();
    let mut accepted = 0u64;
    let mut duplicates = 0u64;
    let mut deferred = Vec::new();
    let mut owner_len: HashMap<usize, usize> = HashMap::new();
    for ri in &row_request {
        *owner_len.entry(*ri).or_default() += 1;
    }
    for (ri, (request, p)) in requests.into_iter().zip(placement).enumerate() {
        match p {
            None => deferred.push(request),
            Some(Placement::Owner { start }) => {
                let len = owner_len.get(&ri).copied().unwrap_or(0);
                if rejected.contains(&ri) {
                    let index = (start..start + len)
                        .position(|i| matches!(&fences[i], Fence::Taken { fingerprint, .. } if *fingerprint != rows[i].fingerprint))
                        .unwrap_or(0);
                    // The request's rows now live in the group's `rows`.
                    let key = rows[start + index].idempotency_key.clone();
                    request
                        .reply
                        .send(Err(IngestError::Conflict { index, key }))
                        .ok();
                    continue;
                }
                let mut out = Vec::with_capacity(len);
                for (i, row) in rows.iter().enumerate().skip(start).take(len) {
                    let (outcome, fp) = effective(i);
                    match outcome {
                        ItemOutcome::Accepted(_) => {
                            accepted += 1;
                            woken.insert(row.tenant_id);
                        }
                        ItemOutcome::Duplicate(_) => duplicates += 1,
                    }
                    remember(ctx, row, outcome.id(), fp);
                    out.push(outcome);
                }
                request.reply.send(Ok(out)).ok();
            }
            Some(Placement::Dependent { owner_row }) => {
                if rejected.contains(&row_request[owner_row]) {
                    // The owner's key was rolled back: decide next time.
                    deferred.push(request);
                    continue;
                }
                let (outcome, fp) = effective(owner_row);
                if fp == request.rows[0].fingerprint {
                    duplicates += 1;
                    request
                        .reply
                        .send(Ok(vec![ItemOutcome::Duplicate(outcome.id())]))
                        .ok();
                } else {
                    let key = request.rows[0].idempotency_key.clone();
                    request
                        .reply
                        .send(Err(IngestError::Conflict { index: 0, key }))
                        .ok();
                }
            }
        }
    }
    ctx.metrics.events_accepted.inc_by(accepted);
    ctx.metrics.events_duplicate.inc_by(duplicates);
    for tenant in woken {
        ctx.wake(tenant);
    }
    debug!(
        rows = rows.len(),
        accepted,
        duplicates,
        elapsed_us = started.elapsed().as_micros() as u64,
        "group committed"
    );

    let mut retry = Vec::with_capacity(deferred.len());
    for mut request in deferred {
        request.deferrals += 1;
        if request.deferrals > 8 {
            request.reply.send(Err(IngestError::Unavailable)).ok();
        } else {
            retry.push(request);
        }
    }
    retry
}

/// A group the database refused: one request alone is refused with the
/// reason; a larger group is committed as two halves (recursively).
async fn isolate(
    ctx: &Ctx,
    mut requests: Vec<IngestRequest>,
    error: fastack_core::Error,
) -> Vec<IngestRequest> {
    if requests.len() == 1 {
        let request = requests.pop().expect("one request");
        let event_ids: Vec<String> = request
            .rows
            .iter()
            .map(|r| r.event_id.to_string())
            .collect();
        warn!(
            op = "group commit",
            tenant = %request.rows.first().map(|r| r.tenant_id.to_string()).unwrap_or_default(),
            ?event_ids,
            %error,
            "the database refused a request; the rest of its group was committed"
        );
        request
            .reply
            .send(Err(IngestError::Refused {
                reason: error.to_string(),
            }))
            .ok();
        return Vec::new();
    }
    ctx.metrics.group_commit_splits.inc();
    let second = requests.split_off(requests.len() / 2);
    let mut deferred = Box::pin(flush(ctx, requests)).await;
    deferred.extend(Box::pin(flush(ctx, second)).await);
    deferred
}

/// Feeds the idempotency cache so the next duplicate is answered without a
/// database round trip.
fn remember(ctx: &Ctx, row: &IngestRow, id: EventId, fingerprint: [u8; 32]) {
    ctx.idempotency.insert(
        row.tenant_id,
        row.idempotency_key.clone(),
        (id, fingerprint),
    );
}
