//! The node's ingest queue: what the front door hands the group commit
//! (the ingest writer) and waits on. It belongs to the node, not to
//! the writer actor, so requests queued when the writer restarts are still
//! there; and it is kept apart from the actor so the node's shared context
//! holds it without importing any actor.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use fastack_core::store::IngestRow;
use fastack_entities::EventId;
use ractor::RpcReplyPort;
use tokio::sync::{Mutex, Notify, mpsc};

/// How a row came out of the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemOutcome {
    /// New event, durably queued under this id.
    Accepted(EventId),
    /// Same key and same content as an earlier event: its id.
    Duplicate(EventId),
}

impl ItemOutcome {
    pub fn id(&self) -> EventId {
        match self {
            ItemOutcome::Accepted(id) | ItemOutcome::Duplicate(id) => *id,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    /// Row `index` reuses a key with different content; nothing of the
    /// request was kept.
    #[error("idempotency key {key:?} of item {index} was used with a different payload")]
    Conflict { index: usize, key: String },
    /// The database refused this request's values (nothing of it was
    /// kept; the other requests of its group were committed).
    #[error("the event store refused the request: {reason}")]
    Refused { reason: String },
    #[error("the event store is unavailable")]
    Unavailable,
}

pub type IngestReply = Result<Vec<ItemOutcome>, IngestError>;

/// One front-door request: its rows are kept all together or not at all.
pub struct IngestRequest {
    pub rows: Vec<IngestRow>,
    pub reply: RpcReplyPort<IngestReply>,
    /// Nothing of the request commits after this.
    pub(crate) deadline: Instant,
    pub(crate) deferrals: u8,
}

/// How long past a group's deadline the writer still waits for the store:
/// a statement the store took just before the deadline has this long to
/// report its commit. The caller's own wait ends after it (see
/// [`IngestQueue::submit`]).
pub const COMMIT_GRACE: Duration = Duration::from_millis(50);

/// The node's ingest queue (bounded: a slow database pushes back on callers).
#[derive(Clone)]
pub struct IngestQueue {
    pub(crate) tx: mpsc::Sender<IngestRequest>,
    pub(crate) rx: Arc<Mutex<mpsc::Receiver<IngestRequest>>>,
    /// Rows queued and not yet taken into a group.
    pub(crate) rows: Arc<AtomicUsize>,
    /// Rows worth a group commit of their own next to one in flight.
    pub(crate) split_rows: usize,
    /// Signalled when `rows` reaches `split_rows`.
    pub(crate) split_ready: Arc<Notify>,
}

impl IngestQueue {
    pub fn new(capacity: usize, split_rows: usize) -> Self {
        let (tx, rx) = mpsc::channel(capacity);
        IngestQueue {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            rows: Arc::default(),
            split_rows,
            split_ready: Arc::default(),
        }
    }

    /// Queues rows and waits for the commit that makes them durable, or
    /// for `deadline` (plus the writer's grace) to pass: then the answer is
    /// [`IngestError::Unavailable`] and nothing of the rows commits.
    ///
    /// The writer keeps that bound: it answers a request it takes after
    /// the request's deadline at once, and stops waiting for the store at
    /// a group's deadline plus [`COMMIT_GRACE`]; its commit slots are held
    /// no longer than that, so a queued request is taken in time. Only a
    /// full queue is waited for here, and no longer than the deadline. (A
    /// timer per request for the reply cost 1 % of a `track` request's
    /// instructions; no timer is made unless the queue is full.)
    pub async fn submit(&self, rows: Vec<IngestRow>, deadline: Instant) -> IngestReply {
        let (tx, rx) = ractor::concurrency::oneshot();
        let request = IngestRequest {
            rows,
            reply: tx.into(),
            deadline,
            deferrals: 0,
        };
        let queued = match self.try_enqueue(request) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(request)) => matches!(
                tokio::time::timeout_at(
                    tokio::time::Instant::from_std(deadline),
                    self.enqueue(request)
                )
                .await,
                Ok(Ok(()))
            ),
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        };
        if !queued {
            return Err(IngestError::Unavailable);
        }
        rx.await.unwrap_or(Err(IngestError::Unavailable))
    }

    /// Queues without waiting; a full queue gives the request back.
    fn try_enqueue(
        &self,
        request: IngestRequest,
    ) -> Result<(), mpsc::error::TrySendError<IngestRequest>> {
        let n = request.rows.len();
        self.count_in(n);
        self.tx.try_send(request).inspect_err(|_| {
            self.rows.fetch_sub(n, Ordering::Relaxed);
        })
    }

    /// Counts `n` rows in, waking a waiting second commit when they make
    /// a group worth one.
    fn count_in(&self, n: usize) {
        let before = self.rows.fetch_add(n, Ordering::Relaxed);
        if before < self.split_rows && before + n >= self.split_rows {
            self.split_ready.notify_one();
        }
    }

    pub(crate) async fn enqueue(&self, request: IngestRequest) -> Result<(), IngestRequest> {
        let n = request.rows.len();
        self.count_in(n);
        self.tx.send(request).await.map_err(|e| {
            self.rows.fetch_sub(n, Ordering::Relaxed);
            e.0
        })
    }

    /// Takes `n` rows off the count when they go into a group.
    pub(crate) fn taken(&self, n: usize) {
        self.rows.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn queued_rows(&self) -> usize {
        self.rows.load(Ordering::Relaxed)
    }

    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}
