//! API keys (`api_keys`): kept as the SHA-256 of the key and looked up by
//! it on every request; revoked, and touched when used.

use chrono::{DateTime, Utc};
use fastack_entities::{
    ApiKey, ApiKeyId, Tenant, TenantId,
    db::{Time, api_key, tenant},
};
use sea_orm::{
    ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, sea_query::Expr,
};

use super::db::{Db, domain, unique_as_conflict};
use crate::error::Result;

/// An API key with its tenant, as the front door needs it.
#[derive(Clone, Debug)]
pub struct KeyRecord {
    pub key: ApiKey,
    pub tenant: Tenant,
}

/// The API keys (see the module doc).
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    pub(super) db: &'a Db,
}

impl Keys<'_> {
    /// A new key, stored as `hash` (the SHA-256 of the key shown once).
    pub async fn insert(self, key: &ApiKey, hash: &[u8; 32]) -> Result<()> {
        api_key::Entity::insert(api_key::Model::new(key, hash).into_active_model())
            .exec_without_returning(self.db)
            .await
            .map_err(|e| unique_as_conflict(e.into(), "api key"))?;
        Ok(())
    }

    /// A tenant's keys, oldest first (revoked ones included).
    pub async fn list(self, tenant: TenantId) -> Result<Vec<ApiKey>> {
        use api_key::Column as C;
        domain(
            api_key::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .order_by_asc(C::CreatedAt)
                .order_by_asc(C::Id)
                .all(self.db)
                .await?,
        )
    }

    /// Revokes a key not yet revoked; whether it did.
    pub async fn revoke(self, id: ApiKeyId, at: DateTime<Utc>) -> Result<bool> {
        use api_key::Column as C;
        let r = api_key::Entity::update_many()
            .col_expr(C::RevokedAt, Expr::value(Time(at)))
            .filter(C::Id.eq(id))
            .filter(C::RevokedAt.is_null())
            .exec(self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    /// The key with this hash and its tenant (the front door, on a cache miss).
    pub async fn lookup(self, hash: &[u8; 32]) -> Result<Option<KeyRecord>> {
        let found = api_key::Entity::find()
            .filter(api_key::Column::KeyHash.eq(hash.to_vec()))
            .find_also_related(tenant::Entity)
            .one(self.db)
            .await?;
        let Some((key, Some(tenant))) = found else {
            return Ok(None);
        };
        Ok(Some(KeyRecord {
            key: key.into(),
            tenant: tenant.try_into()?,
        }))
    }

    /// Records when a key was last used.
    pub async fn touch(self, id: ApiKeyId, at: DateTime<Utc>) -> Result<()> {
        api_key::Entity::update_many()
            .col_expr(api_key::Column::LastUsedAt, Expr::value(Time(at)))
            .filter(api_key::Column::Id.eq(id))
            .exec(self.db)
            .await?;
        Ok(())
    }
}
