//! `fastack-bench`: the load tool, a binary of its own so the server binary
//! carries none of it. It starts the server under test (`--server`, by
//! default the `fastack` beside this binary) and its own bare baseline
//! endpoint, and drives both with one profile ([`load`]).

mod load;

/// The same allocator as the server: the load tool shares its two cores.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Load tool: drives a real fastack server and a bare poem baseline with
/// the same profile (see benches/README.md).
#[derive(Parser)]
#[command(
    name = "fastack-bench",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: load::BenchArgs,
}

#[derive(Subcommand)]
enum Command {
    /// The bare baseline endpoint (202, fixed body), started by a run.
    #[command(hide = true)]
    Baseline {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = match cli.command {
        Some(Command::Baseline { listen }) => load::baseline(listen).await,
        None => load::run(cli.run).await,
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
