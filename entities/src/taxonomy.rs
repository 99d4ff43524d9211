//! A tenant's tracking plan as stored: every install is a new version; a
//! removal is a version without a document.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::TenantId;

/// One version of a tenant's tracking plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanVersion {
    pub tenant_id: TenantId,
    pub version: u32,
    /// The plan document; `None` when this version removed the plan.
    pub document: Option<Value>,
    pub installed_at: DateTime<Utc>,
}
