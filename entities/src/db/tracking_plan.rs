//! `tracking_plans`: every version of every tenant's tracking plan.

use sea_orm::entity::prelude::*;

use super::{Corrupt, Time, unsigned};
use crate::{PlanVersion, TenantId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tracking_plans")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: TenantId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub version: i32,
    /// The document as JSON text; NULL when this version removed the plan.
    pub document: Option<String>,
    pub installed_at: Time,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl TryFrom<Model> for PlanVersion {
    type Error = Corrupt;

    fn try_from(m: Model) -> Result<Self, Corrupt> {
        Ok(PlanVersion {
            tenant_id: m.tenant_id,
            version: unsigned(m.version),
            document: m
                .document
                .map(|d| serde_json::from_str(&d))
                .transpose()
                .map_err(|e| Corrupt {
                    what: "tracking plan",
                    detail: e.to_string(),
                })?,
            installed_at: m.installed_at.0,
        })
    }
}
