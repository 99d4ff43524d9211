//! `fastack`: the one binary. `serve` runs a node; the other subcommands
//! (`src/cli/`) administer the same storage the configuration points at,
//! through the application layer the admin listener uses.

mod cli;

/// glibc's allocator spent a quarter of the node's CPU under load (many
/// small, short-lived allocations across threads); mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use fastack_core::Config;

/// Logs on standard error (colored on a terminal), filtered by `filter`.
fn init_logging(filter: &str) {
    use std::io::IsTerminal;
    fastack_core::logging::init(filter, std::io::stderr().is_terminal());
}

/// The configuration of this process: the product's settings and every
/// sink's, from the environment (and the file `FASTACK_CONFIG` names).
fn config() -> anyhow::Result<Config> {
    Config::load(std::env::vars(), &fastack_actors::sinks::settings())
        .context("reading configuration")
}

/// `fastack serve`: a node, until a stop signal.
async fn serve() -> anyhow::Result<()> {
    let config = config()?;
    init_logging(&config.log);
    let server = fastack_api::start(config, fastack_api::StartOptions::default())
        .await
        .context("starting the server")?;
    server.wait_for_stop_signal().await;
    Ok(())
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // SAFETY: first thing, on the only thread: no SQLite connection exists.
    #[allow(unsafe_code)]
    let _ = unsafe { fastack_core::store::sqlite::alloc::install() };
    // SAFETY: as above; still before any SQLite connection.
    #[allow(unsafe_code)]
    let _ = unsafe { fastack_core::store::sqlite::pcache::install() };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The reader of our standard output went away (`| head`): not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
