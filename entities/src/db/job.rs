//! `jobs`: exports and retention archives, their claims and their
//! terminal event until it is in the outbox.

use sea_orm::entity::prelude::*;
use serde_json::{Map, Value};

use super::{Corrupt, Time, unsigned};
use crate::{Job, JobId, NodeId, TenantId};

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: JobId,
    pub tenant_id: TenantId,
    pub kind: String,
    pub status: String,
    pub params: Json,
    pub metadata: Json,
    pub result: Option<Json>,
    pub execution_time_ms: Option<i64>,
    pub created_at: Time,
    pub started_at: Option<Time>,
    pub finished_at: Option<Time>,
    pub claimed_by: Option<NodeId>,
    pub claim_expires_at: Option<Time>,
    pub attempts: i32,
    pub event_pending: bool,
    pub event_body: Option<String>,
    pub repair_claimed_until: Option<Time>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl TryFrom<Model> for Job {
    type Error = Corrupt;

    fn try_from(m: Model) -> Result<Self, Corrupt> {
        Ok(Job {
            id: m.id,
            tenant_id: m.tenant_id,
            kind: m.kind.parse().map_err(Corrupt::of("job kind"))?,
            status: m.status.parse().map_err(Corrupt::of("job status"))?,
            params: m.params,
            metadata: match m.metadata {
                Value::Object(map) => map,
                _ => Map::new(),
            },
            result: m.result,
            execution_time_ms: m.execution_time_ms,
            created_at: m.created_at.0,
            finished_at: m.finished_at.map(|t| t.0),
            event_body: m.event_body,
            event_pending: m.event_pending,
            attempts: unsigned(m.attempts),
        })
    }
}
