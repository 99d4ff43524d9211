//! The account console's records: `console_users`, `console_links` and
//! `console_sessions` (sea-orm entities, one query for both backends),
//! reached through [`ConsoleRecords`] (`Storage::console`). The rules that
//! decide what to write (passwords, lockout, expiry) are the console
//! module's; this one only reads and writes rows.

use chrono::{DateTime, Utc};
use fastack_entities::{
    TenantId, UserId,
    db::{Time, console_link, console_session, console_user},
};
use sea_orm::{
    ColumnTrait, EntityTrait, ExprTrait, IntoActiveModel, QueryFilter, QueryOrder, sea_query::Expr,
};

use super::db::{Db, unique_as_conflict};
use crate::error::Result;

/// The console's rows (see the module doc).
#[derive(Clone, Copy)]
pub struct ConsoleRecords<'a> {
    pub(super) db: &'a Db,
}

impl ConsoleRecords<'_> {
    /// A new user; a second user with the same email is a conflict.
    pub async fn insert_user(self, row: console_user::Model) -> Result<()> {
        let email = row.email.clone();
        console_user::Entity::insert(row.into_active_model())
            .exec_without_returning(self.db)
            .await
            .map_err(|e| {
                unique_as_conflict(e.into(), &format!("a console user with email {email}"))
            })?;
        Ok(())
    }

    /// The user of a (normalised) email.
    pub async fn user_by_email(self, email: &str) -> Result<Option<console_user::Model>> {
        Ok(console_user::Entity::find()
            .filter(console_user::Column::Email.eq(email))
            .one(self.db)
            .await?)
    }

    pub async fn user(self, id: UserId) -> Result<Option<console_user::Model>> {
        Ok(console_user::Entity::find_by_id(id).one(self.db).await?)
    }

    /// Every user (of one tenant), by email.
    pub async fn users(self, tenant: Option<TenantId>) -> Result<Vec<console_user::Model>> {
        use console_user::Column as C;
        let mut q = console_user::Entity::find().order_by_asc(C::Email);
        if let Some(t) = tenant {
            q = q.filter(C::TenantId.eq(t));
        }
        Ok(q.all(self.db).await?)
    }

    /// Deletes a user and their links (their sessions are ended first by
    /// the caller).
    pub async fn delete_user(self, id: UserId) -> Result<()> {
        console_link::Entity::delete_many()
            .filter(console_link::Column::UserId.eq(id))
            .exec(self.db)
            .await?;
        console_user::Entity::delete_by_id(id).exec(self.db).await?;
        Ok(())
    }

    /// Sets a user's password hash and clears their failures and lock.
    pub async fn set_password(self, id: UserId, hash: String) -> Result<()> {
        use console_user::Column as U;
        console_user::Entity::update_many()
            .col_expr(U::PasswordHash, Expr::value(hash))
            .col_expr(U::FailedSignins, Expr::value(0))
            .col_expr(U::LockedUntil, Expr::value(Option::<Time>::None))
            .filter(U::Id.eq(id))
            .exec(self.db)
            .await?;
        Ok(())
    }

    /// Clears a user's failed sign-ins and lock.
    pub async fn clear_failures(self, id: UserId) -> Result<()> {
        use console_user::Column as U;
        console_user::Entity::update_many()
            .col_expr(U::FailedSignins, Expr::value(0))
            .col_expr(U::LockedUntil, Expr::value(Option::<Time>::None))
            .filter(U::Id.eq(id))
            .exec(self.db)
            .await?;
        Ok(())
    }

    /// Counts one more failed sign-in, or, with `lock`, locks the account
    /// until then and starts counting again.
    pub async fn count_failure(self, id: UserId, lock: Option<DateTime<Utc>>) -> Result<()> {
        use console_user::Column as U;
        console_user::Entity::update_many()
            .col_expr(
                U::FailedSignins,
                if lock.is_some() {
                    Expr::value(0)
                } else {
                    Expr::col(U::FailedSignins).add(1)
                },
            )
            .col_expr(U::LockedUntil, Expr::value(lock.map(Time)))
            .filter(U::Id.eq(id))
            .exec(self.db)
            .await?;
        Ok(())
    }

    pub async fn insert_link(self, row: console_link::Model) -> Result<()> {
        console_link::Entity::insert(row.into_active_model())
            .exec_without_returning(self.db)
            .await?;
        Ok(())
    }

    pub async fn link(self, token_hash: Vec<u8>) -> Result<Option<console_link::Model>> {
        Ok(console_link::Entity::find_by_id(token_hash)
            .one(self.db)
            .await?)
    }

    /// Marks a link used; false if it already was (a link works once).
    pub async fn use_link(self, token_hash: Vec<u8>, now: DateTime<Utc>) -> Result<bool> {
        use console_link::Column as L;
        let used = console_link::Entity::update_many()
            .col_expr(L::UsedAt, Expr::value(Time(now)))
            .filter(L::TokenHash.eq(token_hash))
            .filter(L::UsedAt.is_null())
            .exec(self.db)
            .await?;
        Ok(used.rows_affected == 1)
    }

    pub async fn insert_session(self, row: console_session::Model) -> Result<()> {
        console_session::Entity::insert(row.into_active_model())
            .exec_without_returning(self.db)
            .await?;
        Ok(())
    }

    pub async fn session(self, token_hash: Vec<u8>) -> Result<Option<console_session::Model>> {
        Ok(console_session::Entity::find_by_id(token_hash)
            .one(self.db)
            .await?)
    }

    /// Records that a session was used now.
    pub async fn touch_session(self, token_hash: Vec<u8>, now: DateTime<Utc>) -> Result<()> {
        use console_session::Column as S;
        console_session::Entity::update_many()
            .col_expr(S::LastSeenAt, Expr::value(Time(now)))
            .filter(S::TokenHash.eq(token_hash))
            .exec(self.db)
            .await?;
        Ok(())
    }

    pub async fn delete_session(self, token_hash: Vec<u8>) -> Result<()> {
        console_session::Entity::delete_by_id(token_hash)
            .exec(self.db)
            .await?;
        Ok(())
    }

    /// Ends every session of a user; returns how many there were.
    pub async fn delete_sessions_of(self, user: UserId) -> Result<u64> {
        Ok(console_session::Entity::delete_many()
            .filter(console_session::Column::UserId.eq(user))
            .exec(self.db)
            .await?
            .rows_affected)
    }
}
