//! `webhook_attempts`: the log of each delivery attempt (no bodies).

use sea_orm::entity::prelude::*;

use super::{Time, signed, unsigned};
use crate::{Attempt, DeliveryId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_attempts")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub delivery_id: DeliveryId,
    pub attempt: i32,
    pub attempted_at: Time,
    pub status_code: Option<i32>,
    pub error_kind: Option<String>,
    pub latency_ms: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl From<Model> for Attempt {
    fn from(m: Model) -> Self {
        Attempt {
            attempt: unsigned(m.attempt),
            attempted_at: m.attempted_at.0,
            status_code: m.status_code.map(|c| c.clamp(0, 999) as u16),
            error_kind: m.error_kind,
            latency_ms: unsigned(m.latency_ms),
        }
    }
}

impl ActiveModel {
    /// A new attempt row (its id is the database's).
    pub fn new(delivery: DeliveryId, a: &Attempt) -> Self {
        ActiveModel {
            id: sea_orm::ActiveValue::NotSet,
            delivery_id: sea_orm::ActiveValue::Set(delivery),
            attempt: sea_orm::ActiveValue::Set(signed(a.attempt)),
            attempted_at: sea_orm::ActiveValue::Set(a.attempted_at.into()),
            status_code: sea_orm::ActiveValue::Set(a.status_code.map(i32::from)),
            error_kind: sea_orm::ActiveValue::Set(a.error_kind.clone()),
            latency_ms: sea_orm::ActiveValue::Set(signed(a.latency_ms)),
        }
    }
}
