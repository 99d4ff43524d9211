//! Webhook endpoints (`webhook_endpoints`): registered with a sealed
//! secret, enabled and disabled (disabling fails what the endpoint still
//! owes and tells `endpoint.disabled` subscribers, in one transaction), and
//! their secrets rotated with an overlap.

use chrono::{DateTime, Utc};
use fastack_entities::{
    Endpoint, EndpointId, TenantId,
    db::{Time, webhook_endpoint},
};
use sea_orm::{
    ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, QueryTrait, sea_query::Expr,
};

use super::db::Db;

use crate::error::Result;

/// The webhook endpoints (see the module doc).
#[derive(Clone, Copy)]
pub struct Endpoints<'a> {
    pub(super) db: &'a Db,
}

impl Endpoints<'_> {
    /// A new endpoint with its sealed signing secret.
    pub async fn insert(self, ep: &Endpoint, secret: &[u8]) -> Result<()> {
        webhook_endpoint::Entity::insert(
            webhook_endpoint::Model::new(ep, secret).into_active_model(),
        )
        .exec_without_returning(self.db)
        .await?;
        Ok(())
    }

    /// Endpoints, oldest first: a tenant's, or every tenant's.
    pub async fn list(self, tenant: Option<TenantId>) -> Result<Vec<Endpoint>> {
        use webhook_endpoint::Column as C;
        let rows = webhook_endpoint::Entity::find()
            .apply_if(tenant, |q, t| q.filter(C::TenantId.eq(t)))
            .order_by_asc(C::CreatedAt)
            .order_by_asc(C::Id)
            .all(self.db)
            .await?;
        Ok(rows.iter().map(Endpoint::from).collect())
    }

    /// One sealed signing secret, if any endpoint exists (a master key is
    /// checked against it).
    pub async fn any_sealed_secret(self) -> Result<Option<Vec<u8>>> {
        use sea_orm::QuerySelect;
        Ok(webhook_endpoint::Entity::find()
            .select_only()
            .column(webhook_endpoint::Column::SecretEnc)
            .into_tuple::<Vec<u8>>()
            .one(self.db)
            .await?)
    }

    /// One endpoint by id.
    pub async fn get(self, id: EndpointId) -> Result<Option<Endpoint>> {
        let row = webhook_endpoint::Entity::find_by_id(id)
            .one(self.db)
            .await?;
        Ok(row.as_ref().map(Endpoint::from))
    }

    /// The current secret becomes the previous one (signing until
    /// `previous_until`); `secret` becomes current.
    pub async fn rotate_secret(
        self,
        id: EndpointId,
        secret: &[u8],
        previous_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        use webhook_endpoint::Column as C;
        let r = webhook_endpoint::Entity::update_many()
            .col_expr(C::PreviousSecretEnc, Expr::col(C::SecretEnc))
            .col_expr(C::PreviousUntil, Expr::value(Time(previous_until)))
            .col_expr(C::SecretEnc, Expr::value(secret.to_vec()))
            .col_expr(C::UpdatedAt, Expr::value(Time(now)))
            .filter(C::Id.eq(id))
            .exec(self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    /// Whether an enabled endpoint of the tenant subscribes to the type.
    pub async fn subscribed(self, tenant: TenantId, event_type: &str) -> Result<bool> {
        Ok(self
            .list(Some(tenant))
            .await?
            .iter()
            .any(|e| e.wants(event_type)))
    }
}
