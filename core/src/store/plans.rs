//! Tracking plan versions (`tracking_plans`): each install is the
//! tenant's next version, and removing a plan is a version too; processing
//! checks events against the latest.

use chrono::{DateTime, Utc};
use fastack_entities::{
    PlanVersion, TenantId,
    db::{signed, tracking_plan, unsigned},
};
use sea_orm::{
    ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    sea_query::OnConflict,
};
use serde_json::Value;

use super::db::{Db, domain, domain_opt};
use crate::error::{Error, Result};

/// The tracking plans (see the module doc).
#[derive(Clone, Copy)]
pub struct Plans<'a> {
    pub(super) db: &'a Db,
}

impl Plans<'_> {
    /// Stores `document` as the tenant's next plan version (`None`: the
    /// plan is removed) and returns the version.
    pub async fn install(
        self,
        tenant: TenantId,
        document: Option<&Value>,
        at: DateTime<Utc>,
    ) -> Result<u32> {
        use tracking_plan::Column as C;
        // Two installs at once choose the same next version: the primary
        // key refuses the second, which reads the latest again.
        for _ in 0..5 {
            let latest = self.version(tenant, None).await?.map_or(0, |p| p.version);
            let row = tracking_plan::Model {
                tenant_id: tenant,
                version: signed(latest + 1),
                document: document.map(Value::to_string),
                installed_at: at.into(),
            };
            let inserted = tracking_plan::Entity::insert(row.into_active_model())
                .on_conflict(
                    OnConflict::columns([C::TenantId, C::Version])
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(self.db)
                .await?;
            if inserted == 1 {
                return Ok(latest + 1);
            }
        }
        Err(Error::Conflict(
            "the tracking plan is being changed concurrently; try again".to_owned(),
        ))
    }

    /// One version of a tenant's plan; the latest when `version` is `None`.
    pub async fn version(
        self,
        tenant: TenantId,
        version: Option<u32>,
    ) -> Result<Option<PlanVersion>> {
        use tracking_plan::Column as C;
        domain_opt(
            tracking_plan::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .apply_if(version, |q, v| q.filter(C::Version.eq(signed(v))))
                .order_by_desc(C::Version)
                .one(self.db)
                .await?,
        )
    }

    /// Every version of a tenant's plan, oldest first.
    pub async fn history(self, tenant: TenantId) -> Result<Vec<PlanVersion>> {
        use tracking_plan::Column as C;
        domain(
            tracking_plan::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .order_by_asc(C::Version)
                .all(self.db)
                .await?,
        )
    }

    /// The latest plan version of every tenant that ever had one.
    pub async fn latest_versions(self) -> Result<Vec<(TenantId, u32)>> {
        use tracking_plan::Column as C;
        let rows: Vec<(TenantId, i32)> = tracking_plan::Entity::find()
            .select_only()
            .column(C::TenantId)
            .column_as(C::Version.max(), "version")
            .group_by(C::TenantId)
            .into_tuple()
            .all(self.db)
            .await?;
        Ok(rows.into_iter().map(|(t, v)| (t, unsigned(v))).collect())
    }
}
