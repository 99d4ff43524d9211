//! `master_key`: which master key the store is written with (a check value,
//! never the key) and the root key it wraps. One row, id 1.

use sea_orm::entity::prelude::*;

use super::Time;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "master_key")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: i32,
    /// Hex of a value derived from the master key that names it without
    /// revealing it.
    pub check_value: String,
    /// The root key, AES-256-GCM under a key derived from the master key.
    pub wrapped_root: Vec<u8>,
    pub created_at: Time,
    pub rotated_at: Option<Time>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
