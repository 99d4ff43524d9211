//! `console_users`: the people who sign in to a tenant's account console.
//! A user belongs to one tenant; the email is unique across the deployment
//! so the sign-in form needs nothing else.

use sea_orm::entity::prelude::*;

use super::Time;
use crate::{TenantId, UserId};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_users")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: UserId,
    pub tenant_id: TenantId,
    /// Lowercased at creation.
    #[sea_orm(unique)]
    pub email: String,
    /// `owner` or `viewer`.
    pub role: String,
    /// An argon2id PHC string; NULL until the one-time link was used.
    pub password_hash: Option<String>,
    /// Failed sign-ins since the last success (the account's budget).
    pub failed_signins: i32,
    pub locked_until: Option<Time>,
    pub created_at: Time,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
