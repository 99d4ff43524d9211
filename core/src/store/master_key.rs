//! The master key's record (`master_key`, one row): which master key the
//! store is written with — a check value, never the key — and the root key
//! it wraps. Written at a store's first start, replaced by a rotation only
//! while it still names the key being rotated away.

use chrono::{DateTime, Utc};
use fastack_entities::db::{Time, master_key};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, sea_query::Expr, sea_query::OnConflict,
};

use super::db::Db;
use crate::error::{Error, Result};

/// The row's one id.
const ID: i32 = 1;

/// The master key's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterKeyRecord {
    /// Names the master key the root key is wrapped with.
    pub check_value: String,
    pub wrapped_root: Vec<u8>,
    pub created_at: DateTime<Utc>,
    pub rotated_at: Option<DateTime<Utc>>,
}

/// The master key's record (see the module doc).
#[derive(Clone, Copy)]
pub struct MasterKeys<'a> {
    pub(super) db: &'a Db,
}

impl MasterKeys<'_> {
    /// The record, if the store has one (a store written before it had
    /// none).
    pub async fn get(self) -> Result<Option<MasterKeyRecord>> {
        Ok(master_key::Entity::find_by_id(ID)
            .one(self.db)
            .await?
            .map(|m| MasterKeyRecord {
                check_value: m.check_value,
                wrapped_root: m.wrapped_root,
                created_at: m.created_at.0,
                rotated_at: m.rotated_at.map(|t| t.0),
            }))
    }

    /// Records the first master key; the record in force after it (this
    /// one, or the one another node recorded first).
    pub async fn record_first(
        self,
        check_value: &str,
        wrapped_root: Vec<u8>,
        now: DateTime<Utc>,
    ) -> Result<MasterKeyRecord> {
        master_key::Entity::insert(master_key::ActiveModel {
            id: Set(ID),
            check_value: Set(check_value.to_owned()),
            wrapped_root: Set(wrapped_root),
            created_at: Set(Time(now)),
            rotated_at: Set(None),
        })
        .on_conflict(
            OnConflict::column(master_key::Column::Id)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(self.db)
        .await?;
        self.get()
            .await?
            .ok_or_else(|| Error::Corrupt("the master key's record vanished".to_owned()))
    }

    /// Replaces the record with one for another master key, if it still
    /// names `expected` (two rotations at once: one wins); whether it did.
    pub async fn rewrap(
        self,
        expected: &str,
        check_value: &str,
        wrapped_root: Vec<u8>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        use master_key::Column as C;
        let n = master_key::Entity::update_many()
            .col_expr(C::CheckValue, Expr::value(check_value.to_owned()))
            .col_expr(C::WrappedRoot, Expr::value(wrapped_root))
            .col_expr(C::RotatedAt, Expr::value(Some(Time(now))))
            .filter(C::Id.eq(ID))
            .filter(C::CheckValue.eq(expected))
            .exec(self.db)
            .await?
            .rows_affected;
        Ok(n == 1)
    }
}
