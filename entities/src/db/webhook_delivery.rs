//! `webhook_deliveries`: one event for one endpoint, its state and when it
//! is next due.

use sea_orm::entity::prelude::*;

use super::{Corrupt, Time};
use crate::{Attempt, Delivery, DeliveryId, EndpointId, TenantId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: DeliveryId,
    pub endpoint_id: EndpointId,
    pub tenant_id: TenantId,
    pub event_type: String,
    pub ce_id: String,
    pub body: String,
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: Option<Time>,
    pub claimed_until: Option<Time>,
    pub created_at: Time,
    pub emitted_at: Time,
    pub last_attempt_at: Option<Time>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::webhook_endpoint::Entity",
        from = "Column::EndpointId",
        to = "super::webhook_endpoint::Column::Id"
    )]
    Endpoint,
}

impl Related<super::webhook_endpoint::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Endpoint.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// The delivery as listed, with its attempts.
    pub fn into_delivery(self, attempts: Vec<Attempt>) -> Result<Delivery, Corrupt> {
        Ok(Delivery {
            webhook_id: self.id.webhook_id(),
            id: self.id,
            endpoint_id: self.endpoint_id,
            tenant_id: self.tenant_id,
            event_type: self.event_type,
            ce_id: self.ce_id,
            status: self
                .status
                .parse()
                .map_err(Corrupt::of("delivery status"))?,
            attempts,
            next_attempt_at: self.next_attempt_at.map(|t| t.0),
            created_at: self.created_at.0,
        })
    }
}
