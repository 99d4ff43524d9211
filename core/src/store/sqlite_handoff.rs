//! The embedded store's inbox rows kept in memory for processing: the inbox
//! writer adds each group commit's rows (with their events as the front door
//! validated them) once the commit is durable, processing takes its rounds
//! from here instead of reading and decoding them from the inbox file, and
//! a consume forgets them. The file stays the record: after a restart, or
//! for rows written some other way, rounds read it as before.
//!
//! The hand-off starts once the store is migrated, on the writer's thread
//! between two commits, knowing which tenants had rows in the file then.
//! A tenant's queue is armed by the first row a group commit adds for it
//! and holds, from then on, every inbox row of the tenant above its
//! `floor` that is not consumed yet: every later row of the file is written
//! by the inbox writer, which adds it here, except a quarantined event put
//! back (the main writer's), which disarms the queue. The floor is the
//! lowest `seq` for a tenant with no rows in the file at the start (the
//! processor's rounds start below their cursor, to catch rows committed
//! out of order), the row before the queue's first otherwise. So a round
//! whose rows start at or above the floor gets from here exactly what the
//! file would give it; any other round reads the file, as does the
//! processor's periodic full read, which finds a row the file gained some
//! other way (another process).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use fastack_entities::TenantId;
use parking_lot::Mutex;

use super::processing::Item;

/// Rows a tenant's queue holds at most: beyond it (processing far behind
/// the front door), the queue starts over at the next row and rounds read
/// the file until they reach it.
const HOLD_AT_MOST: usize = 20_000;

/// The tenants' queues; shared by the inbox writer and processing.
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Off until [`Handoff::start`]: no queue is armed.
    started: bool,
    tenants: HashMap<TenantId, Queue>,
    /// Tenants that may have rows in the file below their next queue.
    partial: HashSet<TenantId>,
}

#[derive(Debug)]
struct Queue {
    /// Every unconsumed row of the tenant above this `seq` is in `rows`.
    floor: i64,
    /// In `seq` order.
    rows: VecDeque<Item>,
}

impl Handoff {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Handoff::default())
    }

    /// Arms queues from now on; `backlog`: the tenants with rows in the
    /// file now. Called between two group commits.
    pub(crate) fn start(&self, backlog: HashSet<TenantId>) {
        let mut state = self.state.lock();
        state.started = true;
        state.tenants.clear();
        state.partial = backlog;
    }

    /// A group commit's queued rows, in the order it inserted them (so in
    /// `seq` order), after the commit.
    pub(crate) fn committed(&self, rows: impl IntoIterator<Item = (TenantId, Item)>) {
        let mut state = self.state.lock();
        if !state.started {
            return;
        }
        let State {
            tenants, partial, ..
        } = &mut *state;
        for (tenant, item) in rows {
            let queue = tenants.entry(tenant).or_insert_with(|| Queue {
                floor: if partial.remove(&tenant) {
                    item.seq - 1
                } else {
                    i64::MIN
                },
                rows: VecDeque::new(),
            });
            if queue.rows.len() >= HOLD_AT_MOST {
                // The rows dropped stay in the file, below the new floor.
                queue.rows.clear();
                queue.floor = item.seq - 1;
            }
            queue.rows.push_back(item);
        }
    }

    /// The rows a round after `after_seq` takes (at most `limit`), when the
    /// tenant's queue holds all of them; `None` when the file must be read.
    pub(crate) fn read(
        &self,
        tenant: TenantId,
        after_seq: Option<i64>,
        limit: u32,
    ) -> Option<Vec<Item>> {
        // A full read (no `after_seq`) is the file's.
        let after = after_seq?;
        let state = self.state.lock();
        let queue = state.tenants.get(&tenant).filter(|q| after >= q.floor)?;
        let start = queue.rows.partition_point(|i| i.seq <= after);
        Some(
            queue
                .rows
                .range(start..)
                .take(limit as usize)
                .cloned()
                .collect(),
        )
    }

    /// Rows deleted from the file after their processing committed
    /// (`seqs` in ascending order).
    pub(crate) fn consumed(&self, tenant: TenantId, seqs: &[i64]) {
        let mut state = self.state.lock();
        let Some(queue) = state.tenants.get_mut(&tenant) else {
            return;
        };
        // Usually the queue's head, in order.
        let mut rest = seqs;
        while let (Some(front), Some((first, tail))) = (queue.rows.front(), rest.split_first()) {
            if front.seq == *first {
                queue.rows.pop_front();
                rest = tail;
            } else if front.seq > *first {
                rest = tail;
            } else {
                break;
            }
        }
        if !rest.is_empty() {
            queue.rows.retain(|i| rest.binary_search(&i.seq).is_err());
        }
    }

    /// The tenant's inbox rows changed outside the inbox writer (an event
    /// quarantined or put back): its rounds read the file until the next
    /// group commit arms a new queue.
    pub(crate) fn disarm(&self, tenant: TenantId) {
        let mut state = self.state.lock();
        state.tenants.remove(&tenant);
        state.partial.insert(tenant);
    }
}
