//! `quarantine`: accepted events that processing refused again and again,
//! set aside with why.

use sea_orm::entity::prelude::*;

use super::{Time, unsigned};
use crate::{EventId, QuarantinedEvent, TenantId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "quarantine")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: TenantId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: EventId,
    pub payload: String,
    pub received_at: Time,
    pub error: String,
    pub attempts: i32,
    pub quarantined_at: Time,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl From<Model> for QuarantinedEvent {
    fn from(m: Model) -> Self {
        QuarantinedEvent {
            tenant_id: m.tenant_id,
            event_id: m.event_id,
            payload: QuarantinedEvent::payload_value(&m.payload),
            received_at: m.received_at.0,
            error: m.error,
            attempts: unsigned(m.attempts),
            quarantined_at: m.quarantined_at.0,
        }
    }
}
