//! `fastack-migration`: the sea-orm-migration CLI over fastack's migrations
//! (`up`, `down`, `status`, `fresh`). Reads `DATABASE_URL`. The main binary's
//! `fastack migrate` is what operators normally run.

use sea_orm_migration::prelude::*;

#[tokio::main]
async fn main() {
    cli::run_cli(fastack_migration::Migrator).await;
}
