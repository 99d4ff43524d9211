//! Jobs (`jobs`): queued by the API and by retention, claimed by one node
//! at a time, ended exactly once with their terminal event written to the
//! outbox in the same transaction ([`end_job`]); a sweep writes again the
//! event of a job that ended but whose outbox row was lost.

use chrono::{DateTime, Duration, Utc};
use fastack_entities::{
    Job, JobId, JobKind, JobStatus, NodeId, TenantId,
    db::{Time, job},
};
use sea_orm::{
    ColumnTrait, EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    sea_query::{Expr, Func, LockBehavior, LockType},
};
use serde_json::Value;

use super::{
    Emit, Topic,
    db::{Db, Q, Tx, corrupt, domain, domain_opt, unique_as_conflict},
    emit, outbox,
};
use crate::error::Result;

/// The routing key and CloudEvents id of a job's terminal event.
pub fn job_event(id: JobId, status: JobStatus) -> (String, String) {
    let status = status.as_str();
    (
        format!("job.{status}"),
        format!("fastack.job.{status}.{id}"),
    )
}

/// The jobs (see the module doc).
#[derive(Clone, Copy)]
pub struct Jobs<'a> {
    pub(super) db: &'a Db,
}

impl Jobs<'_> {
    /// Queues a job; a second active retention job for one partition is a conflict.
    pub async fn insert(self, j: &Job) -> Result<()> {
        job::Entity::insert(job_model(j))
            .exec_without_returning(self.db)
            .await
            .map_err(|e| unique_as_conflict(e.into(), "an active job for this partition"))?;
        Ok(())
    }

    /// One job of the tenant.
    pub async fn get(self, tenant: TenantId, id: JobId) -> Result<Option<Job>> {
        domain_opt(
            job::Entity::find_by_id(id)
                .filter(job::Column::TenantId.eq(tenant))
                .one(self.db)
                .await?,
        )
    }

    /// A tenant's jobs, newest first, of one status when given, up to `limit`.
    pub async fn list(
        self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        use job::Column as C;
        domain(
            job::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .apply_if(status, |q, s| q.filter(C::Status.eq(s.as_str())))
                .order_by_desc(C::CreatedAt)
                .order_by_desc(C::Id)
                .limit(u64::from(limit))
                .all(self.db)
                .await?,
        )
    }

    /// Claims the oldest runnable job (queued, or processing with an expired
    /// claim: its runner died) for this node, of one kind if given.
    pub async fn claim(
        self,
        node: NodeId,
        now: DateTime<Utc>,
        claim_for: Duration,
        kind: Option<JobKind>,
    ) -> Result<Option<Job>> {
        use job::Column as C;
        // The oldest runnable job, locked so two nodes claim different ones
        // (SQLite has one writer: no lock there).
        let next = job::Entity::find()
            .select_only()
            .column(C::Id)
            .apply_if(kind, |q, k| q.filter(C::Kind.eq(k.as_str())))
            .filter(
                C::Status.eq(JobStatus::Queued.as_str()).or(C::Status
                    .eq(JobStatus::Processing.as_str())
                    .and(C::ClaimExpiresAt.lt(Time(now)))),
            )
            .order_by_asc(C::CreatedAt)
            .limit(1)
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .into_query();
        let claimed = job::Entity::update_many()
            .col_expr(C::Status, Expr::value(JobStatus::Processing.as_str()))
            .col_expr(C::ClaimedBy, Expr::value(node))
            .col_expr(C::ClaimExpiresAt, Expr::value(Time(now + claim_for)))
            .col_expr(
                C::StartedAt,
                Func::coalesce([Expr::col(C::StartedAt), Expr::value(Time(now))]).into(),
            )
            .col_expr(C::Attempts, Expr::col(C::Attempts).add(1))
            .filter(C::Id.in_subquery(next))
            .exec_with_returning(self.db)
            .await?;
        domain_opt(claimed.into_iter().next())
    }

    /// Extends this node's claim on a running job; whether it still holds it.
    pub async fn renew_claim(self, id: JobId, node: NodeId, until: DateTime<Utc>) -> Result<bool> {
        use job::Column as C;
        let r = job::Entity::update_many()
            .col_expr(C::ClaimExpiresAt, Expr::value(Time(until)))
            .filter(C::Id.eq(id))
            .filter(C::ClaimedBy.eq(node))
            .filter(C::Status.eq(JobStatus::Processing.as_str()))
            .exec(self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    /// Writes the terminal state, the pending-event marker and the outbox row
    /// in one transaction — only if this node still holds the job, so a job
    /// ends exactly once. Returns whether it did.
    pub async fn finish(self, j: &Job, node: NodeId, emit: &Emit) -> Result<bool> {
        let mut tx = self.db.begin().await?;
        if !end_job(&mut tx, j, node, emit).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Terminal jobs whose marker is still set but whose outbox row is gone
    /// (a crash between confirm and clear): writes their stored event body
    /// to the outbox again, same ce-id. Claimed, so several nodes sweeping
    /// at once do the work once.
    pub async fn repair_pending_events(
        self,
        now: DateTime<Utc>,
        claim_for: Duration,
        emit: &Emit,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        let mut tx = self.db.begin().await?;
        let rows = tx
            .fetch(
                Q::new(format!(
                    "UPDATE jobs SET repair_claimed_until = $2 \
                     WHERE id IN (SELECT id FROM jobs \
                                  WHERE event_pending AND status IN ('completed', 'failed') \
                                    AND event_body IS NOT NULL \
                                    AND (repair_claimed_until IS NULL OR repair_claimed_until < $1) \
                                    AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = jobs.id) \
                                  ORDER BY finished_at LIMIT $3{}) \
                     RETURNING id, tenant_id, status, event_body",
                    self.db.dialect().skip_locked("jobs")
                ))
                .bind(now)
                .bind(now + claim_for)
                .bind(i64::from(limit)),
            )
            .await?;
        let mut repaired = Vec::with_capacity(rows.len());
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            let id = JobId(row.uuid("id")?);
            let status: JobStatus = row.text("status")?.parse().map_err(corrupt)?;
            let (routing_key, ce_id) = job_event(id, status);
            entries.push(outbox::Entry {
                tenant_id: TenantId(row.uuid("tenant_id")?),
                topic: Topic::Job,
                routing_key,
                ce_id,
                subject: id.to_string(),
                body: row.text("event_body")?,
                record: None,
                job_id: Some(id),
                created_at: now,
            });
            repaired.push(id);
        }
        emit::write(&mut tx, entries, emit).await?;
        if !emit.relays() && !repaired.is_empty() {
            // No relayed sink takes them (any more): the fan-out's
            // deliveries, written above, were all that was owed.
            tx.run(
                &job::Entity::update_many()
                    .col_expr(job::Column::EventPending, Expr::value(false))
                    .filter(job::Column::Id.is_in(repaired.clone())),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(repaired)
    }

    /// Partition tables with a retention job queued or running.
    pub async fn active_retention(self) -> Result<Vec<String>> {
        use job::Column as C;
        let jobs = job::Entity::find()
            .filter(C::Kind.eq(JobKind::Retention.as_str()))
            .filter(C::Status.is_in([JobStatus::Queued.as_str(), JobStatus::Processing.as_str()]))
            .all(self.db)
            .await?;
        Ok(jobs
            .into_iter()
            .filter_map(|j| Some(j.params.get("partition")?.as_str()?.to_owned()))
            .collect())
    }
}

/// A unique violation is a conflict with a readable message.
/// A new job row.
pub(crate) fn job_model(j: &Job) -> job::ActiveModel {
    use sea_orm::ActiveValue::Set;
    job::ActiveModel {
        id: Set(j.id),
        tenant_id: Set(j.tenant_id),
        kind: Set(j.kind.as_str().to_owned()),
        status: Set(j.status.as_str().to_owned()),
        params: Set(j.params.clone()),
        metadata: Set(Value::Object(j.metadata.clone())),
        created_at: Set(j.created_at.into()),
        ..Default::default()
    }
}

/// Writes a job's terminal state, its pending-event marker and its outbox
/// row in `tx` — only if `node` still holds the job, so a job ends exactly
/// once. Returns whether it did (the caller commits).
pub(crate) async fn end_job(tx: &mut Tx<'_>, j: &Job, node: NodeId, emit: &Emit) -> Result<bool> {
    use job::Column as C;
    let body = j.render();
    let n = tx
        .run(
            &job::Entity::update_many()
                .col_expr(C::Status, Expr::value(j.status.as_str()))
                .col_expr(C::Metadata, Expr::value(Value::Object(j.metadata.clone())))
                .col_expr(C::Result, Expr::value(j.result.clone()))
                .col_expr(C::ExecutionTimeMs, Expr::value(j.execution_time_ms))
                .col_expr(C::FinishedAt, Expr::value(j.finished_at.map(Time)))
                .col_expr(C::EventBody, Expr::value(body.as_str()))
                // Pending while a relayed sink owes its outbox row; the
                // fan-out's deliveries commit with this transaction.
                .col_expr(C::EventPending, Expr::value(emit.relays()))
                .col_expr(C::ClaimedBy, Expr::value(Option::<NodeId>::None))
                .col_expr(C::ClaimExpiresAt, Expr::value(Option::<Time>::None))
                .filter(C::Id.eq(j.id))
                .filter(C::ClaimedBy.eq(node))
                .filter(C::Status.eq(JobStatus::Processing.as_str())),
        )
        .await?;
    if n != 1 {
        return Ok(false);
    }
    let (routing_key, ce_id) = job_event(j.id, j.status);
    emit::write(
        tx,
        vec![outbox::Entry {
            tenant_id: j.tenant_id,
            topic: Topic::Job,
            routing_key,
            ce_id,
            subject: j.id.0.to_string(),
            body,
            record: None,
            job_id: Some(j.id),
            created_at: j.finished_at.unwrap_or_else(Utc::now),
        }],
        emit,
    )
    .await?;
    Ok(true)
}
