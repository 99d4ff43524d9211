//! Webhook delivery records besides the dispatcher's claims: the fan-out of
//! events to their tenants' endpoints in the transaction that writes them
//! ([`fan_out`]), the operational notifications (`endpoint.disabled`,
//! `delivery.exhausted`) written in the same transaction as what they
//! report, and what people do with deliveries besides receiving them,
//! reached through [`Deliveries`] (`Storage::deliveries`): replay one
//! delivery or every failed one since a time (the same row goes back to
//! pending, so it keeps its `webhook-id` and receivers deduplicate it), see
//! each endpoint's latest outcome, delete an endpoint with its log.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use fastack_entities::{
    DeliveryId, DeliveryStatus, Endpoint, EndpointId, TenantId,
    db::{Time, webhook_attempt, webhook_delivery, webhook_endpoint},
    webhook::{DELIVERY_EXHAUSTED, ENDPOINT_DISABLED, is_operational},
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, sea_query::Expr};
use serde_json::{Value, json};

use super::{
    AttemptRecord, NewDelivery, OutboxRow, Replayed, Storage,
    sql::{Db, Tx},
    sql_store::insert_delivery_rows,
};
use crate::error::{Error, Result};

/// The delivery records people act on (see the module doc).
pub struct Deliveries<'a> {
    pub(super) store: &'a dyn Storage,
    pub(super) db: &'a Db,
}

impl Deliveries<'_> {
    /// Puts one delivery of `tenant` back to pending, due now. A replay is one
    /// more attempt: the attempt count goes on, so a delivery that had used its
    /// three attempts fails again at once if this one fails.
    /// Returns what it did and the delivery's endpoint.
    pub async fn replay(
        &self,
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

    /// Replays every failed delivery of one endpoint created at or after
    /// `since`; returns how many went back to pending.
    pub async fn replay_failed_since(
        &self,
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
    async fn enabled_endpoint(&self, tenant: TenantId, id: EndpointId) -> Result<Endpoint> {
        let ep = self.tenant_endpoint(tenant, id).await?;
        if !ep.enabled {
            return Err(Error::Conflict(
                "the endpoint is disabled; enable it before replaying to it".to_owned(),
            ));
        }
        Ok(ep)
    }

    /// One endpoint of `tenant` (another tenant's is not found).
    pub async fn tenant_endpoint(&self, tenant: TenantId, id: EndpointId) -> Result<Endpoint> {
        self.store
            .get_endpoint(id)
            .await?
            .filter(|e| e.tenant_id == tenant)
            .ok_or(Error::NotFound { what: "endpoint" })
    }

    /// The status of each endpoint's most recent delivery.
    pub async fn latest_status(
        &self,
        tenant: TenantId,
    ) -> Result<HashMap<EndpointId, DeliveryStatus>> {
        use webhook_delivery::Column as C;
        let mut out = HashMap::new();
        for ep in self.store.list_endpoints(Some(tenant)).await? {
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
    pub async fn delete_endpoint(&self, tenant: TenantId, id: EndpointId) -> Result<()> {
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
    pub async fn fan_out_rows(&self, rows: &[OutboxRow], now: DateTime<Utc>) -> Result<usize> {
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
