//! `tenants`: who sends events, on which plan.

use sea_orm::entity::prelude::*;

use super::{Corrupt, Time, signed, unsigned};
use crate::{Tenant, TenantId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: TenantId,
    #[sea_orm(unique)]
    pub name: String,
    pub plan: String,
    pub retention_months: Option<i32>,
    pub created_at: Time,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl TryFrom<Model> for Tenant {
    type Error = Corrupt;

    fn try_from(m: Model) -> Result<Self, Corrupt> {
        Ok(Tenant {
            id: m.id,
            name: m.name,
            plan: m.plan.parse().map_err(|e: crate::UnknownPlan| Corrupt {
                what: "plan",
                detail: e.to_string(),
            })?,
            retention_months: m.retention_months.map(unsigned),
            created_at: m.created_at.0,
        })
    }
}

impl From<&Tenant> for Model {
    fn from(t: &Tenant) -> Self {
        Model {
            id: t.id,
            name: t.name.clone(),
            plan: t.plan.as_str().to_owned(),
            retention_months: t.retention_months.map(signed),
            created_at: t.created_at.into(),
        }
    }
}
