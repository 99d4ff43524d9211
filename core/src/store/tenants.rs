//! Tenants (`tenants`): created by the admin API and by a first start, read
//! with every request's key.

use fastack_entities::{
    Plan, Tenant, TenantId,
    db::{signed, tenant},
};
use sea_orm::{
    ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, sea_query::Expr,
};

use super::db::{Db, domain, domain_opt, unique_as_conflict};
use crate::error::Result;

/// The tenants (see the module doc).
#[derive(Clone, Copy)]
pub struct Tenants<'a> {
    pub(super) db: &'a Db,
}

impl Tenants<'_> {
    /// A new tenant; a name already taken is a conflict.
    pub async fn insert(self, t: &Tenant) -> Result<()> {
        tenant::Entity::insert(tenant::Model::from(t).into_active_model())
            .exec_without_returning(self.db)
            .await
            .map_err(|e| unique_as_conflict(e.into(), &format!("tenant named {}", t.name)))?;
        Ok(())
    }

    /// Every tenant, oldest first.
    pub async fn list(self) -> Result<Vec<Tenant>> {
        use tenant::Column as C;
        domain(
            tenant::Entity::find()
                .order_by_asc(C::CreatedAt)
                .order_by_asc(C::Id)
                .all(self.db)
                .await?,
        )
    }

    /// One tenant by id.
    pub async fn get(self, id: TenantId) -> Result<Option<Tenant>> {
        domain_opt(tenant::Entity::find_by_id(id).one(self.db).await?)
    }

    /// One tenant by its (unique) name.
    pub async fn find_by_name(self, name: &str) -> Result<Option<Tenant>> {
        domain_opt(
            tenant::Entity::find()
                .filter(tenant::Column::Name.eq(name))
                .one(self.db)
                .await?,
        )
    }

    /// Sets a tenant's plan and retention (`None`: the plan's); whether the tenant exists.
    pub async fn update_plan(
        self,
        id: TenantId,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<bool> {
        use tenant::Column as C;
        let r = tenant::Entity::update_many()
            .col_expr(C::Plan, Expr::value(plan.as_str()))
            .col_expr(
                C::RetentionMonths,
                Expr::value(retention_months.map(signed)),
            )
            .filter(C::Id.eq(id))
            .exec(self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }
}
