//! Webhook delivery records besides the dispatcher's claims: the fan-out of
//! events to their tenants' endpoints in the transaction that writes them
//! ([`fan_out`]), the operational notifications (`endpoint.disabled`,
//! `delivery.exhausted`) written in the same transaction as what they
//! report, and what people do with deliveries besides receiving them,
//! reached through [`Deliveries`] (`Storage::deliveries`): replay one
//! delivery or every failed one since a time (the same row goes back to
//! pending, so it keeps its `webhook-id` and receivers deduplicate it), see
//! each endpoint's latest outcome, delete an endpoint with its log.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use fastack_entities::{
    Attempt, Delivery, DeliveryId, DeliveryStatus, Endpoint, EndpointId, TenantId,
    db::{Time, signed, unsigned, webhook_attempt, webhook_delivery, webhook_endpoint},
    webhook::{DELIVERY_EXHAUSTED, ENDPOINT_DISABLED, TEST_MESSAGE, is_operational},
};
use sea_orm::{
    ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    sea_query::{Expr, OnConflict},
};
use serde_json::{Value, json};

use super::{
    Endpoints, OutboxRow, Replayed,
    db::{Db, ListKind, Q, ROWS_PER_INSERT, Tx},
};
use crate::error::{Error, Result};

/// A delivery to create from an outbox row.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    pub id: DeliveryId,
    pub endpoint_id: EndpointId,
    pub tenant_id: TenantId,
    pub event_type: String,
    pub ce_id: String,
    pub body: String,
    /// When the outbox row was written (for the latency metric).
    pub emitted_at: DateTime<Utc>,
}

impl NewDelivery {
    /// A delivery of event `ce_id` to `endpoint_id`. Its id — the
    /// `webhook-id` receivers deduplicate on — is derived from the two, so
    /// a fan-out made again after a crash (its first attempt may already
    /// have gone out) sends the same id. Time-ordered like every id: a v7
    /// with the event's time, a hash in place of the random bits.
    pub fn new(
        endpoint_id: EndpointId,
        tenant_id: TenantId,
        event_type: &str,
        ce_id: &str,
        body: String,
        emitted_at: DateTime<Utc>,
    ) -> Self {
        use sha2::{Digest, Sha256};
        let hash = Sha256::new()
            .chain_update(endpoint_id.0.as_bytes())
            .chain_update(ce_id.as_bytes())
            .finalize();
        let mut bits = [0u8; 10];
        bits.copy_from_slice(&hash[..10]);
        let millis = u64::try_from(emitted_at.timestamp_millis()).unwrap_or(0);
        NewDelivery {
            id: DeliveryId(uuid::Builder::from_unix_timestamp_millis(millis, &bits).into_uuid()),
            endpoint_id,
            tenant_id,
            event_type: event_type.to_owned(),
            ce_id: ce_id.to_owned(),
            body,
            emitted_at,
        }
    }
}

/// An endpoint's sealed signing secrets.
#[derive(Clone, Debug)]
pub struct SealedSecrets {
    pub current: Vec<u8>,
    /// The rotated-out secret, while it still signs.
    pub previous: Option<(Vec<u8>, DateTime<Utc>)>,
}

/// A delivery due for an attempt, with what the attempt needs.
#[derive(Clone, Debug)]
pub struct DueDelivery {
    pub id: DeliveryId,
    pub endpoint: Endpoint,
    pub secrets: SealedSecrets,
    pub event_type: String,
    pub body: String,
    /// Attempts made so far.
    pub attempts: u32,
    pub emitted_at: DateTime<Utc>,
}

/// A finished attempt, to be logged with what it decided.
#[derive(Clone, Debug)]
pub struct AttemptRecord {
    pub delivery: DeliveryId,
    pub endpoint: EndpointId,
    pub attempt: Attempt,
    pub outcome: AttemptOutcome,
}

/// What an attempt decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    Delivered,
    Retry {
        at: DateTime<Utc>,
    },
    /// No more attempts; `disable` the endpoint with this reason (404/410).
    Failed {
        disable: Option<String>,
    },
}

/// The delivery records people act on (see the module doc).
#[derive(Clone, Copy)]
pub struct Deliveries<'a> {
    pub(super) db: &'a Db,
}

impl<'a> Deliveries<'a> {
    fn endpoints(self) -> Endpoints<'a> {
        Endpoints { db: self.db }
    }

    /// Enables or disables an endpoint; disabling fails its pending
    /// deliveries and tells its tenant's `endpoint.disabled` subscribers, in
    /// one transaction.
    pub async fn set_endpoint_enabled(
        self,
        id: EndpointId,
        enabled: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        use webhook_endpoint::Column as C;
        let mut tx = self.db.begin().await?;
        if !enabled && disable_endpoint(&mut tx, id, reason.unwrap_or("disabled"), now).await? {
            tx.commit().await?;
            return Ok(true);
        }
        // Enabling, or disabling one already disabled (its reason changes).
        let n = tx
            .run(
                &webhook_endpoint::Entity::update_many()
                    .col_expr(C::Enabled, Expr::value(enabled))
                    .col_expr(
                        C::DisabledReason,
                        Expr::value(reason.filter(|_| !enabled).map(str::to_owned)),
                    )
                    .col_expr(C::UpdatedAt, Expr::value(Time(now)))
                    .filter(C::Id.eq(id)),
            )
            .await?;
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Puts one delivery of `tenant` back to pending, due now. A replay is one
    /// more attempt: the attempt count goes on, so a delivery that had used its
    /// three attempts fails again at once if this one fails.
    /// Returns what it did and the delivery's endpoint.
    pub async fn replay(
        self,
        tenant: TenantId,
        id: DeliveryId,
        now: DateTime<Utc>,
    ) -> Result<(Replayed, EndpointId)> {
        use webhook_delivery::Column as C;
        let row = webhook_delivery::Entity::find_by_id(id)
            .filter(C::TenantId.eq(tenant))
            .one(self.db)
            .await?
            .ok_or(Error::NotFound { what: "delivery" })?;
        self.enabled_endpoint(tenant, row.endpoint_id).await?;
        let n = requeue(now)
            .filter(C::Id.eq(id))
            .filter(C::Status.ne(DeliveryStatus::Pending.as_str()))
            .exec(self.db)
            .await?
            .rows_affected;
        let done = if n == 1 {
            Replayed::Queued
        } else {
            Replayed::AlreadyPending
        };
        Ok((done, row.endpoint_id))
    }

    /// Queues a test message (`webhook.test`) to one enabled endpoint of
    /// `tenant`, whatever it subscribes to: a delivery like any other
    /// (signed, retried, logged), due now. Returns it.
    pub async fn send_test(
        self,
        tenant: TenantId,
        endpoint: EndpointId,
        now: DateTime<Utc>,
    ) -> Result<NewDelivery> {
        let ep = self.enabled_endpoint(tenant, endpoint).await?;
        let ce_id = format!(
            "fastack.webhook.test.{}.{}",
            ep.id,
            uuid::Uuid::now_v7().simple()
        );
        let body = json!({
            "type": TEST_MESSAGE,
            "endpoint_id": ep.id,
            "tenant_id": ep.tenant_id,
            "url": ep.url,
            "sent_at": now,
        })
        .to_string();
        let delivery = NewDelivery::new(ep.id, tenant, TEST_MESSAGE, &ce_id, body, now);
        let mut tx = self.db.begin().await?;
        insert_delivery_rows(&mut tx, std::slice::from_ref(&delivery), Time(now)).await?;
        tx.commit().await?;
        Ok(delivery)
    }

    /// The tenant a delivery belongs to (an operator names only the
    /// delivery).
    pub async fn tenant_of(self, id: DeliveryId) -> Result<TenantId> {
        webhook_delivery::Entity::find_by_id(id)
            .one(self.db)
            .await?
            .map(|d| d.tenant_id)
            .ok_or(Error::NotFound { what: "delivery" })
    }

    /// Replays every failed delivery of one endpoint created at or after
    /// `since`; returns how many went back to pending.
    pub async fn replay_failed_since(
        self,
        tenant: TenantId,
        endpoint: EndpointId,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        use webhook_delivery::Column as C;
        self.enabled_endpoint(tenant, endpoint).await?;
        Ok(requeue(now)
            .filter(C::TenantId.eq(tenant))
            .filter(C::EndpointId.eq(endpoint))
            .filter(C::Status.eq(DeliveryStatus::Failed.as_str()))
            .filter(C::CreatedAt.gte(Time(since)))
            .exec(self.db)
            .await?
            .rows_affected)
    }

    /// The tenant's endpoint, which must be enabled to be replayed to.
    async fn enabled_endpoint(self, tenant: TenantId, id: EndpointId) -> Result<Endpoint> {
        let ep = self.tenant_endpoint(tenant, id).await?;
        if !ep.enabled {
            return Err(Error::Conflict(
                "the endpoint is disabled; enable it before replaying or sending to it".to_owned(),
            ));
        }
        Ok(ep)
    }

    /// One endpoint of `tenant` (another tenant's is not found).
    pub async fn tenant_endpoint(self, tenant: TenantId, id: EndpointId) -> Result<Endpoint> {
        self.endpoints()
            .get(id)
            .await?
            .filter(|e| e.tenant_id == tenant)
            .ok_or(Error::NotFound { what: "endpoint" })
    }

    /// The status of each endpoint's most recent delivery.
    pub async fn latest_status(
        self,
        tenant: TenantId,
    ) -> Result<HashMap<EndpointId, DeliveryStatus>> {
        use webhook_delivery::Column as C;
        let mut out = HashMap::new();
        for ep in self.endpoints().list(Some(tenant)).await? {
            let last: Option<String> = webhook_delivery::Entity::find()
                .select_only()
                .column(C::Status)
                .filter(C::EndpointId.eq(ep.id))
                .order_by_desc(C::CreatedAt)
                .order_by_desc(C::Id)
                .into_tuple()
                .one(self.db)
                .await?;
            if let Some(status) = last.and_then(|s| s.parse().ok()) {
                out.insert(ep.id, status);
            }
        }
        Ok(out)
    }

    /// Deletes an endpoint of `tenant` with its deliveries and their attempts.
    pub async fn delete_endpoint(self, tenant: TenantId, id: EndpointId) -> Result<()> {
        use webhook_delivery::Column as C;
        self.tenant_endpoint(tenant, id).await?;
        let mut tx = self.db.begin().await?;
        let ids: Vec<DeliveryId> = tx
            .models::<webhook_delivery::Model>(
                &webhook_delivery::Entity::find().filter(C::EndpointId.eq(id)),
            )
            .await?
            .into_iter()
            .map(|d| d.id)
            .collect();
        for chunk in ids.chunks(1_000) {
            tx.run(
                &webhook_attempt::Entity::delete_many()
                    .filter(webhook_attempt::Column::DeliveryId.is_in(chunk.iter().copied())),
            )
            .await?;
        }
        tx.run(&webhook_delivery::Entity::delete_many().filter(C::EndpointId.eq(id)))
            .await?;
        tx.run(&webhook_endpoint::Entity::delete_by_id(id)).await?;
        tx.commit().await
    }

    /// Fans out outbox rows owed to the fan-out (left by an earlier release,
    /// before the fan-out moved into the transaction that writes the event).
    /// Relaxed: a fan-out lost to a crash is made again with the same ids.
    pub async fn fan_out_rows(self, rows: &[OutboxRow], now: DateTime<Utc>) -> Result<usize> {
        let events: Vec<Outgoing<'_>> = rows
            .iter()
            .map(|r| Outgoing {
                tenant: r.tenant_id,
                event_type: &r.routing_key,
                ce_id: &r.ce_id,
                body: &r.body,
                emitted_at: r.created_at,
            })
            .collect();
        let mut tx = self.db.begin_relaxed().await?;
        let n = fan_out(&mut tx, &events, Time(now)).await?;
        tx.commit().await?;
        Ok(n)
    }
}

fn requeue(now: DateTime<Utc>) -> sea_orm::UpdateMany<webhook_delivery::Entity> {
    use webhook_delivery::Column as C;
    webhook_delivery::Entity::update_many()
        .col_expr(C::Status, Expr::value(DeliveryStatus::Pending.as_str()))
        .col_expr(C::NextAttemptAt, Expr::value(Some(Time(now))))
        .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
}

/// An event on its way to its tenant's endpoints.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outgoing<'a> {
    pub tenant: TenantId,
    pub event_type: &'a str,
    pub ce_id: &'a str,
    pub body: &'a str,
    pub emitted_at: DateTime<Utc>,
}

/// The deliveries of `event`: one per endpoint among `endpoints` (its
/// tenant's) that is enabled and subscribed to its type.
fn deliveries_of<'e>(
    endpoints: &'e [Endpoint],
    event: Outgoing<'e>,
) -> impl Iterator<Item = NewDelivery> + 'e {
    endpoints
        .iter()
        .filter(move |e| e.tenant_id == event.tenant && e.wants(event.event_type))
        .map(move |e| {
            NewDelivery::new(
                e.id,
                event.tenant,
                event.event_type,
                event.ce_id,
                event.body.to_owned(),
                event.emitted_at,
            )
        })
}

/// The fan-out's deliveries of outbox entries, in the caller's transaction
/// (see [`fan_out`]); the newest entry's time is when they are due.
pub(crate) async fn fan_out_entries(
    tx: &mut Tx<'_>,
    entries: &[super::outbox::Entry],
) -> Result<usize> {
    let events: Vec<Outgoing<'_>> = entries
        .iter()
        .map(|e| Outgoing {
            tenant: e.tenant_id,
            event_type: &e.routing_key,
            ce_id: &e.ce_id,
            body: &e.body,
            emitted_at: e.created_at,
        })
        .collect();
    let now = entries
        .iter()
        .map(|e| e.created_at)
        .max()
        .unwrap_or_else(Utc::now);
    fan_out(tx, &events, Time(now)).await
}

/// Fans `events` out to their tenants' endpoints as they are in the
/// caller's transaction: the delivery rows commit with whatever wrote the
/// events, due at `now`. Returns how many deliveries it created.
pub(crate) async fn fan_out(tx: &mut Tx<'_>, events: &[Outgoing<'_>], now: Time) -> Result<usize> {
    use webhook_endpoint::Column as E;
    let mut tenants: Vec<TenantId> = events.iter().map(|e| e.tenant).collect();
    tenants.sort();
    tenants.dedup();
    if tenants.is_empty() {
        return Ok(0);
    }
    let endpoints: Vec<Endpoint> = tx
        .models::<webhook_endpoint::Model>(
            &webhook_endpoint::Entity::find()
                .filter(E::TenantId.is_in(tenants))
                .filter(E::Enabled.eq(true)),
        )
        .await?
        .iter()
        .map(Endpoint::from)
        .collect();
    let deliveries: Vec<NewDelivery> = events
        .iter()
        .flat_map(|e| deliveries_of(&endpoints, *e))
        .collect();
    insert_delivery_rows(tx, &deliveries, now).await?;
    Ok(deliveries.len())
}

/// Writes one operational notification to each enabled endpoint of
/// `tenant` subscribed to `event_type`, inside the caller's transaction.
async fn notify(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    event_type: &str,
    ce_id: String,
    body: Value,
    at: DateTime<Utc>,
) -> Result<()> {
    let body = body.to_string();
    let event = Outgoing {
        tenant,
        event_type,
        ce_id: &ce_id,
        body: &body,
        emitted_at: at,
    };
    fan_out(tx, &[event], Time(at)).await.map(drop)
}

/// `endpoint.disabled`, for an endpoint just disabled.
pub(crate) async fn notify_disabled(
    tx: &mut Tx<'_>,
    id: EndpointId,
    reason: &str,
    at: DateTime<Utc>,
) -> Result<()> {
    let Some(ep) = tx
        .models::<webhook_endpoint::Model>(&webhook_endpoint::Entity::find_by_id(id))
        .await?
        .pop()
    else {
        return Ok(());
    };
    let body = json!({
        "type": ENDPOINT_DISABLED,
        "endpoint_id": ep.id,
        "url": ep.url,
        "reason": reason,
        "disabled_at": at,
    });
    let ce_id = format!("fastack.endpoint.disabled.{id}.{}", at.timestamp_micros());
    notify(tx, ep.tenant_id, ENDPOINT_DISABLED, ce_id, body, at).await
}

/// `delivery.exhausted`, for deliveries whose last attempt just failed
/// (never for an operational delivery: a failing subscriber must not feed
/// itself).
pub(crate) async fn notify_exhausted(tx: &mut Tx<'_>, failed: &[&AttemptRecord]) -> Result<()> {
    use webhook_delivery::Column as C;
    if failed.is_empty() {
        return Ok(());
    }
    let rows: HashMap<DeliveryId, webhook_delivery::Model> = tx
        .models::<webhook_delivery::Model>(
            &webhook_delivery::Entity::find()
                .filter(C::Id.is_in(failed.iter().map(|r| r.delivery))),
        )
        .await?
        .into_iter()
        .map(|d| (d.id, d))
        .collect();
    for r in failed {
        let Some(d) = rows.get(&r.delivery) else {
            continue;
        };
        if is_operational(&d.event_type) {
            continue;
        }
        let at = r.attempt.attempted_at;
        let body = json!({
            "type": DELIVERY_EXHAUSTED,
            "delivery_id": d.id,
            "webhook_id": d.id.webhook_id(),
            "endpoint_id": d.endpoint_id,
            "event_type": d.event_type,
            "event_id": d.ce_id,
            "attempts": r.attempt.attempt,
            "last_status_code": r.attempt.status_code,
            "last_error_kind": r.attempt.error_kind,
            "failed_at": at,
        });
        let ce_id = format!("fastack.delivery.exhausted.{}.{}", d.id, r.attempt.attempt);
        notify(tx, d.tenant_id, DELIVERY_EXHAUSTED, ce_id, body, at).await?;
    }
    Ok(())
}

impl Deliveries<'_> {
    /// Claims deliveries whose next attempt is due, except those of the
    /// endpoints in `skip` (their workers are full: claiming their rows only
    /// to give them back would be churn).
    pub async fn claim_due(
        self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
        skip: &[EndpointId],
    ) -> Result<Vec<DueDelivery>> {
        use webhook_delivery::Column as C;
        let d = self.db.dialect();
        // Relaxed: a claim lost to a crash only lets the delivery be
        // claimed again.
        let mut tx = self.db.begin_relaxed().await?;
        let ids: Vec<DeliveryId> = tx
            .fetch(
                Q::new(format!(
                    "SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
                     WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND e.enabled \
                       AND (d.claimed_until IS NULL OR d.claimed_until < $1) AND NOT ({}) \
                     ORDER BY d.next_attempt_at LIMIT $2{}",
                    d.in_list("d.endpoint_id", 3, ListKind::Uuid),
                    d.skip_locked("d")
                ))
                .bind(now)
                .bind(i64::from(limit))
                .bind(skip.iter().map(|e| e.0).collect::<Vec<_>>()),
            )
            .await?
            .iter()
            .map(|r| r.uuid("id").map(DeliveryId))
            .collect::<Result<_>>()?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        tx.run(
            &webhook_delivery::Entity::update_many()
                .col_expr(C::ClaimedUntil, Expr::value(Time(now + claim_for)))
                .filter(C::Id.is_in(ids.clone())),
        )
        .await?;
        let due: Vec<webhook_delivery::Model> = tx
            .models(
                &webhook_delivery::Entity::find()
                    .filter(C::Id.is_in(ids))
                    .order_by_asc(C::NextAttemptAt),
            )
            .await?;
        let endpoints: HashMap<EndpointId, webhook_endpoint::Model> = tx
            .models::<webhook_endpoint::Model>(
                &webhook_endpoint::Entity::find()
                    .filter(webhook_endpoint::Column::Id.is_in(due.iter().map(|d| d.endpoint_id))),
            )
            .await?
            .into_iter()
            .map(|e| (e.id, e))
            .collect();
        tx.commit().await?;
        Ok(due
            .into_iter()
            .filter_map(|d| {
                let e = endpoints.get(&d.endpoint_id)?;
                let endpoint = Endpoint::from(e);
                Some(DueDelivery {
                    id: d.id,
                    secrets: SealedSecrets {
                        current: e.secret_enc.clone(),
                        previous: e
                            .previous_secret_enc
                            .clone()
                            .zip(endpoint.previous_secret_until),
                    },
                    endpoint,
                    event_type: d.event_type,
                    body: d.body,
                    attempts: unsigned(d.attempts),
                    emitted_at: d.emitted_at.0,
                })
            })
            .collect())
    }

    /// Gives claimed deliveries back at once, to be claimed again.
    pub async fn release(self, ids: &[DeliveryId]) -> Result<()> {
        use webhook_delivery::Column as C;
        if ids.is_empty() {
            return Ok(());
        }
        webhook_delivery::Entity::update_many()
            .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
            .filter(C::Id.is_in(ids.iter().copied()))
            .exec(self.db)
            .await?;
        Ok(())
    }

    /// Logs attempts and applies their outcomes, in one transaction.
    pub async fn record_attempts(self, records: &[AttemptRecord]) -> Result<()> {
        use webhook_delivery::Column as C;
        if records.is_empty() {
            return Ok(());
        }
        // Not worth an fsync per attempt: a crash loses at most the last
        // moments of the log, and their deliveries are simply attempted
        // again (same webhook-id, which receivers deduplicate).
        let mut tx = self.db.begin_relaxed().await?;
        for chunk in records.chunks(ROWS_PER_INSERT) {
            tx.run(&webhook_attempt::Entity::insert_many(chunk.iter().map(
                |r| webhook_attempt::ActiveModel::new(r.delivery, &r.attempt),
            )))
            .await?;
        }
        // Deliveries that end the same way are updated together (a flat-out
        // endpoint's batch is one statement); `last_attempt_at` is the
        // group's latest attempt.
        let mut groups: BTreeMap<(&str, u32, Option<Time>), (Time, Vec<DeliveryId>)> =
            BTreeMap::new();
        for r in records {
            let (status, next) = match &r.outcome {
                AttemptOutcome::Delivered => (DeliveryStatus::Delivered, None),
                AttemptOutcome::Retry { at } => (DeliveryStatus::Pending, Some(Time(*at))),
                AttemptOutcome::Failed { .. } => (DeliveryStatus::Failed, None),
            };
            let at = Time(r.attempt.attempted_at);
            let g = groups
                .entry((status.as_str(), r.attempt.attempt, next))
                .or_insert((at, Vec::new()));
            g.0 = Ord::max(g.0, at);
            g.1.push(r.delivery);
        }
        for ((status, attempts, next), (last, ids)) in groups {
            tx.run(
                &webhook_delivery::Entity::update_many()
                    .col_expr(C::Attempts, Expr::value(signed(attempts)))
                    .col_expr(C::LastAttemptAt, Expr::value(last))
                    .col_expr(C::Status, Expr::value(status))
                    .col_expr(C::NextAttemptAt, Expr::value(next))
                    .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
                    .filter(C::Id.is_in(ids)),
            )
            .await?;
        }
        let mut exhausted = Vec::new();
        for r in records {
            match &r.outcome {
                AttemptOutcome::Failed {
                    disable: Some(reason),
                } => {
                    disable_endpoint(&mut tx, r.endpoint, reason, r.attempt.attempted_at).await?;
                }
                AttemptOutcome::Failed { disable: None } => exhausted.push(r),
                _ => {}
            }
        }
        super::deliveries::notify_exhausted(&mut tx, &exhausted).await?;
        tx.commit().await
    }

    /// A tenant's deliveries, newest first, with their attempts; of one
    /// endpoint and in one status when given.
    pub async fn list(
        self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        status: Option<DeliveryStatus>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        use webhook_delivery::Column as C;
        let rows = webhook_delivery::Entity::find()
            .filter(C::TenantId.eq(tenant))
            .apply_if(endpoint, |q, e| q.filter(C::EndpointId.eq(e)))
            .apply_if(status, |q, s| q.filter(C::Status.eq(s.as_str())))
            .order_by_desc(C::CreatedAt)
            .order_by_desc(C::Id)
            .limit(u64::from(limit))
            .all(self.db)
            .await?;
        let mut attempts: HashMap<DeliveryId, Vec<Attempt>> = HashMap::new();
        if !rows.is_empty() {
            use webhook_attempt::Column as A;
            for a in webhook_attempt::Entity::find()
                .filter(A::DeliveryId.is_in(rows.iter().map(|r| r.id)))
                .order_by_asc(A::DeliveryId)
                .order_by_asc(A::Attempt)
                .all(self.db)
                .await?
            {
                attempts.entry(a.delivery_id).or_default().push(a.into());
            }
        }
        rows.into_iter()
            .map(|r| {
                let tried = attempts.remove(&r.id).unwrap_or_default();
                Ok(r.into_delivery(tried)?)
            })
            .collect()
    }
}

/// New deliveries, due at once; one already made for the same endpoint and
/// event (`ce_id`) is left as it is.
pub(crate) async fn insert_delivery_rows(
    tx: &mut Tx<'_>,
    deliveries: &[NewDelivery],
    now: Time,
) -> Result<()> {
    use sea_orm::ActiveValue::Set;
    use webhook_delivery::Column as C;
    for chunk in deliveries.chunks(ROWS_PER_INSERT) {
        let rows = chunk.iter().map(|d| webhook_delivery::ActiveModel {
            id: Set(d.id),
            endpoint_id: Set(d.endpoint_id),
            tenant_id: Set(d.tenant_id),
            event_type: Set(d.event_type.clone()),
            ce_id: Set(d.ce_id.clone()),
            body: Set(d.body.clone()),
            status: Set(DeliveryStatus::Pending.as_str().to_owned()),
            attempts: Set(0),
            next_attempt_at: Set(Some(now)),
            created_at: Set(now),
            emitted_at: Set(d.emitted_at.into()),
            ..Default::default()
        });
        tx.run(
            &webhook_delivery::Entity::insert_many(rows).on_conflict(
                OnConflict::columns([C::EndpointId, C::CeId])
                    .do_nothing()
                    .to_owned(),
            ),
        )
        .await?;
    }
    Ok(())
}

/// Disables an enabled endpoint, fails what it still owes and tells the
/// tenant's `endpoint.disabled` subscribers (once: an endpoint already
/// disabled is left as it is).
pub(super) async fn disable_endpoint(
    tx: &mut Tx<'_>,
    id: EndpointId,
    reason: &str,
    at: DateTime<Utc>,
) -> Result<bool> {
    use webhook_endpoint::Column as E;
    let changed = tx
        .run(
            &webhook_endpoint::Entity::update_many()
                .col_expr(E::Enabled, Expr::value(false))
                .col_expr(E::DisabledReason, Expr::value(reason))
                .col_expr(E::UpdatedAt, Expr::value(Time(at)))
                .filter(E::Id.eq(id))
                .filter(E::Enabled.eq(true)),
        )
        .await?;
    if changed == 1 {
        fail_pending(tx, id).await?;
        notify_disabled(tx, id, reason, at).await?;
    }
    Ok(changed == 1)
}

/// Fails an endpoint's pending deliveries (it was disabled).
async fn fail_pending(tx: &mut Tx<'_>, endpoint: EndpointId) -> Result<()> {
    use webhook_delivery::Column as C;
    tx.run(
        &webhook_delivery::Entity::update_many()
            .col_expr(C::Status, Expr::value(DeliveryStatus::Failed.as_str()))
            .col_expr(C::NextAttemptAt, Expr::value(Option::<Time>::None))
            .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
            .filter(C::EndpointId.eq(endpoint))
            .filter(C::Status.eq(DeliveryStatus::Pending.as_str())),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use fastack_entities::EndpointId;

    use super::*;

    #[test]
    fn a_delivery_made_again_keeps_its_id() {
        let (endpoint, tenant) = (EndpointId::new(), TenantId::new());
        let at: DateTime<Utc> = "2026-12-01T10:00:00.123Z".parse().unwrap();
        let make = |endpoint, ce: &str| {
            NewDelivery::new(endpoint, tenant, "core.event.tracked", ce, "{}".into(), at).id
        };
        let id = make(endpoint, "ev-1");
        assert_eq!(id, make(endpoint, "ev-1"));
        assert_ne!(id, make(endpoint, "ev-2"));
        assert_ne!(id, make(EndpointId::new(), "ev-1"));
        // A v7 carrying the event's time: delivery ids still sort by time.
        assert_eq!(id.0.get_version_num(), 7);
        let (secs, nanos) = id.0.get_timestamp().unwrap().to_unix();
        assert_eq!((secs, nanos / 1_000_000), (at.timestamp() as u64, 123));
    }
}
