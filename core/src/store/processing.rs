//! The processing transaction, written once for both backends: take a
//! tenant's inbox rows through the second idempotency fence (deleting them,
//! where the inbox shares the transaction; looking their `tracked_events`
//! rows up, where it does not), resolve identities (snapshot →
//! [`identity::resolve`] → apply), append to `tracked_events`, write
//! `core.event.tracked` for its sinks (webhook deliveries, outbox rows). A
//! backend opens the transaction (lease renewal, commit durability) and
//! says where a month's rows go ([`Layout`]); everything else is here.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use fastack_entities::{ContactId, EventId, IdentityKind, NewEvent, NodeId, TenantId};
use uuid::Uuid;

use super::{
    Emit, Month, PartitionKey, Topic, annotations,
    db::{Arg, Col, Db, Dialect, ListKind, Q, Row, Tx},
    decode_payload, emit,
    encoding::{TrackedView, json_text, tracked_body_of},
    erasures::SCREEN,
    event_record::write_record,
    known_contacts::{KnownContacts, LeaseMark},
    outbox,
    partitions::Layout,
};
use crate::{domain::sha256_hex, error::Result, identity};

/// Whether an enabled endpoint of the tenant (`$1`) subscribes to
/// `core.event.tracked`: the same SQL on both backends.
pub(crate) const TRACKED_SUBSCRIBED: &str = "EXISTS (SELECT 1 FROM webhook_endpoints e \
     WHERE e.tenant_id = $1 AND e.enabled AND (',' || e.events || ',') LIKE '%,core.event.tracked,%')";

/// Work for one processing transaction.
#[derive(Clone, Debug)]
pub struct ProcessRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    pub retention_class: i16,
    pub limit: u32,
    pub now: DateTime<Utc>,
    pub lease_ttl: Duration,
    /// The sinks that take every `core.event.tracked` (the AMQP relay
    /// when streaming is on).
    pub tracked: Emit,
    /// The sinks that take `core.event.tracked` when an enabled endpoint of
    /// the tenant subscribes to it (the webhook fan-out). Decided inside the
    /// transaction, from the endpoints as they are then: an endpoint added
    /// before the transaction starts gets its events, on every node.
    pub tracked_if_subscribed: Emit,
    /// Read only inbox rows whose `seq` is above this (`None`: from the
    /// tenant's oldest row). Lets a processor start its index scan near the
    /// live rows instead of walking every row deleted since the last vacuum.
    pub after_seq: Option<i64>,
    /// Faults a test armed (none in production).
    pub faults: crate::faults::SharedFaults,
}

impl ProcessRequest {
    /// The sinks this transaction's events are written for, given whether
    /// the tenant's endpoints take them.
    pub(crate) fn emit_tracked(&self, subscribed: bool) -> Emit {
        if subscribed {
            self.tracked.and(&self.tracked_if_subscribed)
        } else {
            self.tracked.clone()
        }
    }

    /// Fails the transaction when a test armed a fault for one of these
    /// events (called by every backend once the batch is read, so the
    /// rollback is the real one).
    pub fn check_faults(&self, events: &[(EventId, NewEvent, DateTime<Utc>)]) -> Result<()> {
        self.faults
            .check_processing(events.iter().map(|(_, e, _)| e.idempotency_key.as_str()))
    }
}

/// What one processing transaction did.
#[derive(Clone, Debug, Default)]
pub struct ProcessOutcome {
    /// Inbox rows consumed (processed now or already processed before).
    pub consumed: usize,
    /// Events appended to `tracked_events` by this transaction.
    pub appended: Vec<(EventId, DateTime<Utc>)>,
    /// Rows skipped by the second fence (processed by an earlier attempt).
    pub already_processed: usize,
    /// Oldest `received_at` among consumed rows, for the lag metric.
    pub received: Vec<DateTime<Utc>>,
    /// Highest inbox `seq` consumed.
    pub last_seq: Option<i64>,
    /// Outbox rows written for sinks woken at commit (events on their way
    /// to relayed sinks; a grouped sink's rows wait for its timer and are
    /// not counted).
    pub outboxed: usize,
    /// Webhook deliveries created (the fan-out, in the same transaction).
    pub deliveries: usize,
    /// Events consumed without being stored: their identifier is
    /// suppressed.
    pub suppressed: usize,
    /// Events consumed without being stored: they belong to a running
    /// erasure's people.
    pub held: usize,
    /// Distinct identities resolved from the node's known contacts.
    pub identities_from_memory: usize,
    /// Distinct identities looked up in the database.
    pub identities_looked_up: usize,
}

/// How a round takes its inbox rows, and where they are deleted.
#[derive(Debug)]
pub(crate) enum Consume {
    /// In the processing transaction, by the statement that reads them (the
    /// inbox is in the same database): the delete is the second fence.
    InTransaction,
    /// From the embedded store's accept log: the transaction records each
    /// event's idempotency key beside it and moves the tenant's cursor from
    /// `round.from` to `round.to` (a compare-and-set: the second fence);
    /// only events moved in from the inbox table are looked up as stored.
    Log { round: LogRound, screen: bool },
}

/// One inbox row, decoded.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    pub(crate) seq: i64,
    pub(crate) id: EventId,
    /// Shared with the embedded store's hand-off (see `sqlite_handoff`).
    pub(crate) event: Arc<NewEvent>,
    pub(crate) received_at: DateTime<Utc>,
}

/// The inbox rows a round takes: after `after_seq`, in `seq` order, at
/// most `limit`. Where the fence is the stored event, a backend may read
/// them outside the transaction (and ahead of it: see [`read`]).
const NEXT_ROWS: &str = "FROM inbox WHERE tenant_id = $1 AND seq > $3 ORDER BY seq LIMIT $2";

fn next_rows(q: Q, tenant: TenantId, after_seq: Option<i64>, limit: u32) -> Q {
    q.bind(tenant.0)
        .bind(i64::from(limit))
        .bind(after_seq.unwrap_or(i64::MIN))
}

fn decode(rows: &[Row]) -> Result<Vec<Item>> {
    let mut items = Vec::with_capacity(rows.len());
    for r in rows {
        items.push(Item {
            seq: r.int("seq")?,
            id: EventId(r.uuid("event_id")?),
            event: Arc::new(decode_payload(&r.text("payload")?)?),
            received_at: r.time("received_at")?,
        });
    }
    // A delete returns its rows in no particular order; events are applied
    // in the order they were accepted.
    items.sort_unstable_by_key(|i| i.seq);
    Ok(items)
}

/// The lease renewal every backend runs first in its processing
/// transaction, minus its `RETURNING`: the lease must still be this node's
/// and unexpired; the expiry it replaces is kept (see [`LeaseMark`]).
pub(crate) const RENEW_LEASE: &str = "UPDATE tenant_leases \
     SET renewed_from = tenant_leases.expires_at, expires_at = $3 \
     WHERE tenant_leases.tenant_id = $1 AND tenant_leases.node_id = $2 \
           AND tenant_leases.expires_at > $4";

/// What [`RENEW_LEASE`] and a lease take return for the node's known
/// contacts.
pub(crate) const LEASE_MARK: &str = "renewed_from, expires_at, contacts_gen";

/// A lease write's [`LEASE_MARK`] columns.
pub(crate) fn lease_mark(row: &Row) -> Result<LeaseMark> {
    Ok(LeaseMark {
        renewed_from: row.opt_time("renewed_from")?,
        expires_at: row.time("expires_at")?,
        contacts_gen: row.int("contacts_gen")?,
    })
}

/// Runs the processing transaction `tx` (opened by the backend, its lease
/// already renewed, finding `lease`) and commits it.
pub(crate) async fn run(
    layout: &dyn Layout,
    mut tx: Tx<'_>,
    emit: Emit,
    req: &ProcessRequest,
    consume: Consume,
    (known, lease): (&KnownContacts, LeaseMark),
) -> Result<ProcessOutcome> {
    let d = tx.dialect();
    let tenant = req.tenant_id;
    let generation = known.leased(tenant, &lease);
    let mut log: Option<LogRound> = None;
    let (items, in_transaction, screen) = match consume {
        // Reading the rows deletes them. A row is returned by one committed
        // delete only (a concurrent one waits for its row locks, then finds
        // it gone), so the delete is the second fence: nothing more is
        // written for it.
        //
        // The same statement reads whether the tenant's events must be
        // screened: it runs once the transaction holds the tenant's lease
        // row, so an erasure that waited for that row before its work sees
        // this transaction's events stored, or this transaction sees its
        // holds.
        Consume::InTransaction => {
            let sql = format!(
                "DELETE FROM inbox WHERE tenant_id = $1 AND {} \
                 RETURNING seq, event_id, payload, received_at, {SCREEN} AS screen",
                d.in_subquery("seq", &format!("SELECT seq {NEXT_ROWS}"))
            );
            let q = next_rows(Q::new(sql), tenant, req.after_seq, req.limit);
            let rows = tx.fetch(q).await?;
            let screen = match rows.first() {
                Some(r) => r.bool("screen")?,
                None => false,
            };
            (decode(&rows)?, true, screen)
        }
        Consume::Log { mut round, screen } => {
            let items = std::mem::take(&mut round.items);
            log = Some(round);
            (items, false, screen)
        }
    };
    if items.is_empty() {
        tx.commit().await?;
        return Ok(ProcessOutcome::default());
    }
    // Looked up as stored: every row of an inbox read outside the
    // transaction; of a log round, only rows moved in from the inbox table.
    let looked_up = |i: &Item| match &log {
        Some(l) => l.legacy.contains(&i.seq),
        None => !in_transaction,
    };
    req.faults
        .check_processing(items.iter().map(|i| i.event.idempotency_key.as_str()))?;

    if let Some(l) = &log {
        // First: a round that lost the race to another of the tenant's
        // stops here, before it writes anything.
        advance_cursor(&mut tx, tenant, l.from, l.to).await?;
    }
    let n = items.len();
    let all: Vec<&Item> = items.iter().collect();
    let partitions = by_partition(&all, req.retention_class);
    let keys: Vec<PartitionKey> = partitions.keys().copied().collect();
    layout.prepare(&mut tx, &keys).await?;
    // Where the rows stay until the caller deletes them after this commit,
    // one processed by an earlier round whose delete was lost (or taken by
    // the round before, read ahead) already has its `tracked_events` row:
    // that row's key is the second fence, looked up here in the one
    // writer's transaction, so no other round can append it meanwhile.
    let mut stored: HashSet<Uuid> = HashSet::new();
    if items.iter().any(looked_up) {
        for (key, idx) in &partitions {
            let pairs: Vec<(DateTime<Utc>, Uuid)> = idx
                .iter()
                .filter(|i| looked_up(all[**i]))
                .map(|i| (all[*i].event.occurred_at.with_timezone(&Utc), all[*i].id.0))
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let q = stored_events(d, &layout.table(key), tenant.0, &pairs);
            for r in tx.fetch(q).await? {
                stored.insert(r.uuid("id")?);
            }
        }
    }
    let todo: Vec<&Item> = items.iter().filter(|i| !stored.contains(&i.id.0)).collect();
    let mut outcome = ProcessOutcome {
        consumed: n,
        // Read in `seq` order.
        last_seq: items.last().map(|i| i.seq),
        already_processed: n - todo.len(),
        received: items.iter().map(|i| i.received_at).collect(),
        ..Default::default()
    };
    let todo = if screen && !todo.is_empty() {
        screen_out(&mut tx, tenant, todo, &mut outcome).await?
    } else {
        todo
    };

    // What the round's identities were found and made to be, for the
    // node's known contacts once the commit is done.
    let mut learned = None;
    if !todo.is_empty() {
        let events: Vec<&NewEvent> = todo.iter().map(|i| &*i.event).collect();
        let (snapshot, found) =
            super::contacts::snapshot(&mut tx, tenant, &events, (known, generation)).await?;
        outcome.identities_from_memory = found.from_memory;
        outcome.identities_looked_up = found.looked_up;
        let mut plan = identity::resolve(&events, &snapshot);
        super::contacts::apply(&mut tx, tenant, &plan, req.now).await?;
        // Applied: the rows below need only each event's contact.
        learned = Some((
            found.fetched,
            std::mem::take(&mut plan.identities),
            std::mem::take(&mut plan.merges),
        ));

        // Rendered once: the event's own row takes the text, a grouped
        // sink's record copies it.
        let mut properties: Vec<String> = todo
            .iter()
            .map(|i| json_text(&i.event.properties))
            .collect();
        let mut records = emit.groups_any().then(|| {
            todo.iter()
                .zip(&plan.contact_of)
                .zip(&properties)
                .map(|((i, contact), props)| {
                    let mut record = String::with_capacity(props.len() + 256);
                    write_record(&mut record, &view(i, *contact), props);
                    record
                })
                .collect::<Vec<String>>()
                .into_iter()
        });
        // Rows by table (one on PostgreSQL, a table per month on SQLite).
        for (key, idx) in &by_partition(&todo, req.retention_class) {
            let table = &layout.table(key);
            let pick = |i: &usize| (todo[*i], plan.contact_of[*i]);
            let rows: Vec<(&Item, ContactId)> = idx.iter().map(pick).collect();
            let k = rows.len();
            let inserted = tx
                .insert(
                    d.insert(
                        table,
                        &[
                            ("tenant_id", Col::Uuid(vec![tenant.0; k])),
                            (
                                "occurred_at",
                                Col::Time(
                                    rows.iter()
                                        .map(|(i, _)| i.event.occurred_at.with_timezone(&Utc))
                                        .collect(),
                                ),
                            ),
                            ("id", Col::Uuid(rows.iter().map(|(i, _)| i.id.0).collect())),
                            (
                                "retention_class",
                                Col::Int(vec![i64::from(req.retention_class); k]),
                            ),
                            (
                                "kind",
                                Col::Text(
                                    rows.iter()
                                        .map(|(i, _)| i.event.kind.as_str().to_owned())
                                        .collect(),
                                ),
                            ),
                            (
                                "event",
                                Col::OptText(
                                    rows.iter().map(|(i, _)| i.event.event.clone()).collect(),
                                ),
                            ),
                            (
                                "contact_id",
                                Col::Uuid(rows.iter().map(|(_, c)| c.0).collect()),
                            ),
                            (
                                "user_id",
                                Col::OptText(
                                    rows.iter().map(|(i, _)| i.event.user_id.clone()).collect(),
                                ),
                            ),
                            (
                                "anonymous_id",
                                Col::OptText(
                                    rows.iter()
                                        .map(|(i, _)| i.event.anonymous_id.clone())
                                        .collect(),
                                ),
                            ),
                            (
                                "properties",
                                Col::Json(
                                    idx.iter()
                                        .map(|i| std::mem::take(&mut properties[*i]))
                                        .collect(),
                                ),
                            ),
                            (
                                "annotations",
                                Col::OptJson(
                                    rows.iter()
                                        .map(|(i, _)| i.event.plan.as_ref().map(annotations))
                                        .collect(),
                                ),
                            ),
                            (
                                "occurred_offset_s",
                                Col::Int(
                                    rows.iter()
                                        .map(|(i, _)| {
                                            i64::from(
                                                i.event.occurred_at.offset().local_minus_utc(),
                                            )
                                        })
                                        .collect(),
                                ),
                            ),
                            (
                                "received_at",
                                Col::Time(rows.iter().map(|(i, _)| i.received_at).collect()),
                            ),
                            (
                                "idempotency_key",
                                Col::Text(
                                    rows.iter()
                                        .map(|(i, _)| i.event.idempotency_key.clone())
                                        .collect(),
                                ),
                            ),
                        ],
                        "",
                    ),
                )
                .await;
            if let Err(e) = inserted {
                if e.is_refusal() {
                    layout.forget();
                }
                return Err(e);
            }
        }
        outcome.appended = todo
            .iter()
            .map(|i| (i.id, i.event.occurred_at.with_timezone(&Utc)))
            .collect();

        if emit.any() {
            let bodies = emit.takes_bodies();
            let entries = todo
                .iter()
                .zip(&plan.contact_of)
                .map(|(i, contact)| {
                    // A grouped row is read back as records, never sent as
                    // one CloudEvent: it needs no id, subject or JSON.
                    let (ce_id, subject, body) = if bodies {
                        (
                            format!("fastack.event.tracked.{}", i.id),
                            i.id.to_string(),
                            tracked_body_of(&view(i, *contact)),
                        )
                    } else {
                        Default::default()
                    };
                    outbox::Entry {
                        tenant_id: tenant,
                        topic: Topic::Core,
                        routing_key: "core.event.tracked".to_owned(),
                        ce_id,
                        subject,
                        body,
                        record: records.as_mut().and_then(Iterator::next),
                        job_id: None,
                        created_at: req.now,
                    }
                })
                .collect();
            let written = emit::write(&mut tx, entries, &emit).await?;
            outcome.outboxed = written.outboxed;
            outcome.deliveries = written.deliveries;
        }
    }
    if let Some(l) = &log {
        record_keys(&mut tx, tenant, &items, l).await?;
    }
    tx.commit().await?;
    layout.created(&keys);
    if let Some((fetched, made, merges)) = learned {
        let ids = fetched.iter().chain(&made);
        known.learn(
            tenant,
            generation,
            ids.map(|(kind, v, c)| (*kind, v.as_str(), *c)),
            &merges,
        );
    }
    Ok(outcome)
}

/// The ids of the rows of `table` (a `tracked_events` table) that
/// tenant `tenant` has among `pairs` of (`occurred_at`, `id`): one
/// primary-key lookup per pair. On SQLite the list drives the join
/// (`CROSS JOIN` fixes the order; as a row-value `IN` or a plain join
/// it searched the key on its first two columns only, or put the table
/// outside).
fn stored_events(d: Dialect, table: &str, tenant: Uuid, pairs: &[(DateTime<Utc>, Uuid)]) -> Q {
    match d {
        Dialect::Postgres => Q::new(format!(
            "SELECT t.id FROM UNNEST($2::timestamptz[], $3::uuid[]) AS j(at, id) \
                 JOIN {table} t ON t.tenant_id = $1 AND t.occurred_at = j.at AND t.id = j.id"
        ))
        .bind(tenant)
        .arg(Arg::Times(pairs.iter().map(|(at, _)| *at).collect()))
        .arg(Arg::Uuids(pairs.iter().map(|(_, id)| *id).collect())),
        Dialect::Sqlite => Q::new(format!(
            "SELECT t.id FROM json_each($2) AS j CROSS JOIN {table} AS t \
             ON t.tenant_id = $1 AND t.occurred_at = (j.value ->> 0) \
             AND t.id = unhex(j.value ->> 1)"
        ))
        .bind(tenant)
        .bind({
            // `[[micros, "hex"], …]`, written directly: a round's list
            // holds up to thousands of pairs.
            use std::fmt::Write as _;
            let mut list = String::with_capacity(2 + pairs.len() * 56);
            list.push('[');
            for (n, (at, id)) in pairs.iter().enumerate() {
                let sep = if n == 0 { "" } else { "," };
                let _ = write!(list, "{sep}[{},\"{}\"]", at.timestamp_micros(), id.simple());
            }
            list.push(']');
            list
        }),
    }
}

/// A round of the embedded store's accept log (see [`Consume::Log`]): the
/// events, what their key rows need, and where the tenant's cursor moves.
#[derive(Debug)]
pub(crate) struct LogRound {
    pub(crate) items: Vec<Item>,
    /// Per item: its content's fingerprint, for its key's row.
    pub(crate) fingerprints: Vec<[u8; 32]>,
    /// Items moved in from the inbox table (an earlier release's rows):
    /// their fence is the stored event, looked up.
    pub(crate) legacy: HashSet<i64>,
    /// The tenant's cursor as the round found it, and its last record.
    pub(crate) from: u64,
    pub(crate) to: u64,
}

/// A log round's idempotency keys (every event's, stored or dropped: a
/// retry of a dropped event is a duplicate too), beside its events.
async fn record_keys(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    items: &[Item],
    log: &LogRound,
) -> Result<()> {
    let d = tx.dialect();
    let n = items.len();
    tx.insert(
        d.insert(
            "idempotency_keys",
            &[
                ("tenant_id", Col::Uuid(vec![tenant.0; n])),
                (
                    "idempotency_key",
                    Col::Text(
                        items
                            .iter()
                            .map(|i| i.event.idempotency_key.clone())
                            .collect(),
                    ),
                ),
                (
                    "event_id",
                    Col::Uuid(items.iter().map(|i| i.id.0).collect()),
                ),
                (
                    "fingerprint",
                    Col::Bytes(log.fingerprints.iter().map(|f| f.to_vec()).collect()),
                ),
                (
                    "occurred_at",
                    Col::Time(
                        items
                            .iter()
                            .map(|i| i.event.occurred_at.with_timezone(&Utc))
                            .collect(),
                    ),
                ),
                (
                    "created_at",
                    Col::Time(items.iter().map(|i| i.received_at).collect()),
                ),
            ],
            "ON CONFLICT DO NOTHING",
        ),
    )
    .await?;
    Ok(())
}

/// Moves the tenant's cursor in the log from `from` to `to`. A cursor
/// found elsewhere than `from` means another round of the tenant committed
/// meanwhile: this one rolls back as a lost lease would.
pub(crate) async fn advance_cursor(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    from: u64,
    to: u64,
) -> Result<()> {
    let (from, to) = (from as i64, to as i64);
    let moved = if from == 0 {
        tx.execute(
            Q::new(
                "INSERT INTO log_cursors (tenant_id, seq) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .bind(tenant.0)
            .bind(to),
        )
        .await?
    } else {
        tx.execute(
            Q::new("UPDATE log_cursors SET seq = $2 WHERE tenant_id = $1 AND seq = $3")
                .bind(tenant.0)
                .bind(to)
                .bind(from),
        )
        .await?
    };
    if moved != 1 {
        return Err(crate::error::Error::LeaseLost);
    }
    Ok(())
}

/// The events of `items` that are not dropped: those of a suppressed
/// identifier, and those of a running erasure's people (in its window) are
/// consumed without being stored or emitted, and counted on their hold or
/// suppression and in `outcome`.
async fn screen_out<'i>(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    items: Vec<&'i Item>,
    outcome: &mut ProcessOutcome,
) -> Result<Vec<&'i Item>> {
    let d = tx.dialect();
    let hashes: Vec<[Option<(i64, String)>; 2]> = items
        .iter()
        .map(|i| {
            [
                i.event
                    .user_id
                    .as_deref()
                    .map(|v| (i64::from(IdentityKind::User.as_i16()), sha256_hex(v))),
                i.event
                    .anonymous_id
                    .as_deref()
                    .map(|v| (i64::from(IdentityKind::Anonymous.as_i16()), sha256_hex(v))),
            ]
        })
        .collect();
    let mut wanted: Vec<String> = hashes
        .iter()
        .flatten()
        .flatten()
        .map(|(_, sha)| sha.clone())
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let mut suppressed: HashMap<(i64, String), i64> = HashMap::new();
    for r in tx
        .fetch(
            Q::new(format!(
                "SELECT kind, sha256 FROM suppressions WHERE tenant_id = $1 AND {}",
                d.in_list("sha256", 2, ListKind::Text)
            ))
            .bind(tenant.0)
            .bind(wanted.clone()),
        )
        .await?
    {
        suppressed.insert((r.int("kind")?, r.text("sha256")?), 0);
    }
    type Hold = (i64, String, Uuid);
    let mut holds: Vec<(Hold, Option<DateTime<Utc>>, Option<DateTime<Utc>>)> = Vec::new();
    for r in tx
        .fetch(
            Q::new(format!(
                "SELECT h.kind, h.sha256, h.request_id, e.window_from, e.window_to \
                 FROM erasure_holds h JOIN erasures e ON e.id = h.request_id \
                 WHERE h.tenant_id = $1 AND {}",
                d.in_list("h.sha256", 2, ListKind::Text)
            ))
            .bind(tenant.0)
            .bind(wanted),
        )
        .await?
    {
        holds.push((
            (r.int("kind")?, r.text("sha256")?, r.uuid("request_id")?),
            r.opt_time("window_from")?,
            r.opt_time("window_to")?,
        ));
    }
    let mut held: HashMap<Hold, i64> = HashMap::new();
    let mut kept = Vec::with_capacity(items.len());
    'items: for (item, ids) in items.into_iter().zip(&hashes) {
        for id in ids.iter().flatten() {
            if let Some(n) = suppressed.get_mut(id) {
                *n += 1;
                outcome.suppressed += 1;
                continue 'items;
            }
        }
        let at = item.event.occurred_at.with_timezone(&Utc);
        for id in ids.iter().flatten() {
            let hold = holds.iter().find(|((kind, sha, _), from, to)| {
                (*kind, sha) == (id.0, &id.1)
                    && from.is_none_or(|f| at >= f)
                    && to.is_none_or(|t| at < t)
            });
            if let Some((key, _, _)) = hold {
                *held.entry(key.clone()).or_default() += 1;
                outcome.held += 1;
                continue 'items;
            }
        }
        kept.push(item);
    }
    for ((kind, sha), n) in suppressed.into_iter().filter(|(_, n)| *n > 0) {
        tx.execute(
            Q::new(
                "UPDATE suppressions SET dropped = dropped + $4 \
                 WHERE tenant_id = $1 AND kind = $2 AND sha256 = $3",
            )
            .bind(tenant.0)
            .bind(kind)
            .bind(sha)
            .bind(n),
        )
        .await?;
    }
    for ((kind, sha, request), n) in held {
        tx.execute(
            Q::new(
                "UPDATE erasure_holds SET dropped = dropped + $5 \
                 WHERE tenant_id = $1 AND kind = $2 AND sha256 = $3 AND request_id = $4",
            )
            .bind(tenant.0)
            .bind(kind)
            .bind(sha)
            .bind(request)
            .bind(n),
        )
        .await?;
    }
    Ok(kept)
}

/// An item as the event JSON and record render it.
fn view(i: &Item, contact_id: ContactId) -> TrackedView<'_> {
    TrackedView {
        id: i.id,
        kind: i.event.kind,
        event: i.event.event.as_deref(),
        contact_id,
        user_id: i.event.user_id.as_deref(),
        anonymous_id: i.event.anonymous_id.as_deref(),
        properties: &i.event.properties,
        occurred_at: i.event.occurred_at,
        received_at: i.received_at,
        plan: i.event.plan.as_ref(),
    }
}

/// Positions of `items` by the partition their rows go to.
fn by_partition(items: &[&Item], retention_class: i16) -> BTreeMap<PartitionKey, Vec<usize>> {
    let mut out: BTreeMap<PartitionKey, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let key = PartitionKey {
            month: Month::of(item.event.occurred_at.with_timezone(&Utc)),
            retention_class,
        };
        out.entry(key).or_default().push(i);
    }
    out
}

/// What a backend does its own way in processing: find the tenants with a
/// backlog, open and commit the processing transaction, delete consumed
/// inbox rows where they live apart.
#[async_trait]
pub(crate) trait ProcessingEngine: Send + Sync {
    /// See [`Processing::backlog_tenants`].
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>>;
    /// See [`Processing::run`]; the backend hands `known` on to [`run`].
    async fn process_batch(
        &self,
        req: &ProcessRequest,
        known: &KnownContacts,
    ) -> Result<ProcessOutcome>;
}

/// Leases, the inbox's backlog and the processing transaction (see the module doc).
#[derive(Clone, Copy)]
pub struct Processing<'a> {
    pub(super) db: &'a Db,
    pub(super) engine: &'a dyn ProcessingEngine,
    pub(super) waiting: &'a dyn super::waiting::WaitingEngine,
    pub(super) known: &'a KnownContacts,
}

impl Processing<'_> {
    /// Takes or renews the tenant's processing lease for this node.
    pub async fn try_lease(
        self,
        tenant: TenantId,
        node: NodeId,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<bool> {
        let holder = self
            .db
            .write_opt(
                Q::new(format!(
                    "INSERT INTO tenant_leases (tenant_id, node_id, expires_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (tenant_id) DO UPDATE SET node_id = excluded.node_id, \
                         renewed_from = tenant_leases.expires_at, expires_at = excluded.expires_at \
                     WHERE tenant_leases.node_id = excluded.node_id OR tenant_leases.expires_at < $4 \
                     RETURNING node_id, {LEASE_MARK}"
                ))
                .bind(tenant.0)
                .bind(node.0)
                .bind(now + ttl)
                .bind(now),
            )
            .await?;
        let Some(row) = holder else { return Ok(false) };
        if row.uuid("node_id")? != node.0 {
            return Ok(false);
        }
        self.known.leased(tenant, &lease_mark(&row)?);
        Ok(true)
    }

    /// Gives up the tenant's lease if this node holds it.
    pub async fn release_lease(self, tenant: TenantId, node: NodeId) -> Result<()> {
        self.db
            .execute(
                Q::new("DELETE FROM tenant_leases WHERE tenant_id = $1 AND node_id = $2")
                    .bind(tenant.0)
                    .bind(node.0),
            )
            .await?;
        Ok(())
    }

    /// Tenants with unprocessed inbox rows.
    pub async fn backlog_tenants(self, limit: u32) -> Result<Vec<TenantId>> {
        self.engine.backlog_tenants(limit).await
    }

    /// Accepted events not processed yet and the oldest one's `received_at`.
    pub async fn inbox_stats(self) -> Result<(i64, Option<DateTime<Utc>>)> {
        self.waiting.waiting_stats(self.db).await
    }

    /// Whether every accepted event is processed. Cheap while events wait,
    /// unlike [`Processing::inbox_stats`], which counts them: for pollers.
    pub async fn inbox_empty(self) -> Result<bool> {
        self.waiting.waiting_empty(self.db).await
    }

    /// One processing transaction: lease check, second fence, identity
    /// resolution, append to `tracked_events`, the events consumed.
    pub async fn run(self, req: &ProcessRequest) -> Result<ProcessOutcome> {
        self.engine.process_batch(req, self.known).await
    }
}
