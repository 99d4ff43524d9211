//! Two columns on `tenant_leases` that let a node keep the tenant's known
//! contacts in memory between processing rounds and know when they may be
//! stale: `renewed_from`, the lease's expiry as a lease write found it
//! (every write of a current node sets it from the expiry it replaces), and
//! `contacts_gen`, counted up by every erasure that deletes the tenant's
//! contacts. A node that finds the expiry it wrote itself and the count it
//! saw knows no other node processed the tenant and no erasure ran since.
//! Older releases write neither column and still change the expiry, so a
//! node of this release sees their rounds too.

use sea_orm_migration::prelude::*;

use crate::column;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum TenantLeases {
    Table,
    RenewedFrom,
    ContactsGen,
}

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let b = manager.get_database_backend();
        // One column a statement: SQLite's ALTER TABLE adds one at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(TenantLeases::Table)
                    .add_column(column::time(b, TenantLeases::RenewedFrom))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(TenantLeases::Table)
                    .add_column(
                        ColumnDef::new(TenantLeases::ContactsGen)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await
    }
}
