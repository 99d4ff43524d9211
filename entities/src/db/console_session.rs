//! `console_sessions`: one row per sign-in, found by a hash of the cookie's
//! random token; deleting a user's rows signs them out everywhere.

use sea_orm::entity::prelude::*;

use super::Time;
use crate::UserId;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_sessions")]
pub struct Model {
    /// SHA-256 of the cookie's token.
    #[sea_orm(primary_key, auto_increment = false)]
    pub token_hash: Vec<u8>,
    pub user_id: UserId,
    pub created_at: Time,
    pub last_seen_at: Time,
    /// The absolute end, however active the session is.
    pub expires_at: Time,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
