//! `console_links`: one-time links that let a user set a password (and sign
//! in). Only a hash of the link's token is kept.

use sea_orm::entity::prelude::*;

use super::Time;
use crate::UserId;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_links")]
pub struct Model {
    /// SHA-256 of the token in the link.
    #[sea_orm(primary_key, auto_increment = false)]
    pub token_hash: Vec<u8>,
    pub user_id: UserId,
    pub expires_at: Time,
    pub used_at: Option<Time>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
