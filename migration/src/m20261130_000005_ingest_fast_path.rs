//! A function the group commit's one-statement fast path called to abort
//! itself when some of its keys already existed, so that statement
//! committed all of its rows or none. The fast path is now a plain insert
//! that a taken key fails by itself (see `commit_group` in the PostgreSQL
//! store); the function stays so that nodes of the previous release keep
//! working during a rolling upgrade. SQLite commits groups differently and
//! needs nothing.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::run_on_postgres(
            manager,
            "CREATE FUNCTION fastack_abort_partial_group() RETURNS bigint LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'ingest group has keys that already exist' USING ERRCODE = 'FA001'; END $$",
        )
        .await
    }
}
