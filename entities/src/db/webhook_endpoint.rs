//! `webhook_endpoints`: where a tenant's notifications go, with the
//! sealed signing secrets.

use sea_orm::entity::prelude::*;

use super::Time;
use crate::{Endpoint, EndpointId, TenantId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_endpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: EndpointId,
    pub tenant_id: TenantId,
    pub url: String,
    /// The subscribed event types, comma-separated.
    pub events: String,
    pub secret_enc: Vec<u8>,
    pub previous_secret_enc: Option<Vec<u8>>,
    pub previous_until: Option<Time>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub created_at: Time,
    pub updated_at: Time,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl From<&Model> for Endpoint {
    fn from(m: &Model) -> Self {
        Endpoint {
            id: m.id,
            tenant_id: m.tenant_id,
            url: m.url.clone(),
            events: m
                .events
                .split(',')
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect(),
            enabled: m.enabled,
            disabled_reason: m.disabled_reason.clone(),
            previous_secret_until: m.previous_until.map(|t| t.0),
            created_at: m.created_at.0,
            updated_at: m.updated_at.0,
        }
    }
}

impl Model {
    pub fn new(ep: &Endpoint, secret: &[u8]) -> Self {
        Model {
            id: ep.id,
            tenant_id: ep.tenant_id,
            url: ep.url.clone(),
            events: ep.events.join(","),
            secret_enc: secret.to_vec(),
            previous_secret_enc: None,
            previous_until: None,
            enabled: ep.enabled,
            disabled_reason: ep.disabled_reason.clone(),
            created_at: ep.created_at.into(),
            updated_at: ep.created_at.into(),
        }
    }
}
