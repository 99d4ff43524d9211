//! `api_keys`: a tenant's keys, by the hash of the secret (never the
//! secret itself).

use sea_orm::entity::prelude::*;

use super::{Time, signed, unsigned};
use crate::{ApiKey, ApiKeyId, TenantId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ApiKeyId,
    pub tenant_id: TenantId,
    #[sea_orm(unique)]
    pub key_hash: Vec<u8>,
    pub prefix: String,
    pub rate_limit_rps: Option<i32>,
    pub created_at: Time,
    pub revoked_at: Option<Time>,
    pub last_used_at: Option<Time>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::tenant::Entity",
        from = "Column::TenantId",
        to = "super::tenant::Column::Id"
    )]
    Tenant,
}

impl Related<super::tenant::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Tenant.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}

impl From<Model> for ApiKey {
    fn from(m: Model) -> Self {
        ApiKey {
            id: m.id,
            tenant_id: m.tenant_id,
            prefix: m.prefix,
            rate_limit_rps: m.rate_limit_rps.map(unsigned),
            created_at: m.created_at.0,
            revoked_at: m.revoked_at.map(|t| t.0),
            last_used_at: m.last_used_at.map(|t| t.0),
        }
    }
}

impl Model {
    pub fn new(key: &ApiKey, hash: &[u8; 32]) -> Self {
        Model {
            id: key.id,
            tenant_id: key.tenant_id,
            key_hash: hash.to_vec(),
            prefix: key.prefix.clone(),
            rate_limit_rps: key.rate_limit_rps.map(signed),
            created_at: key.created_at.into(),
            revoked_at: key.revoked_at.map(Time),
            last_used_at: key.last_used_at.map(Time),
        }
    }
}
