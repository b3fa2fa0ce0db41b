//! `taquba-workflow`: the command line of a taquba-workflow store. It lists,
//! describes and steers the runs of a store (a directory or a bucket
//! prefix) from any process, without taking the store over: reads go
//! through a read-only `taquba::QueueReader`, changes go to the owning
//! process as commands in the store's inbox (or, `--offline`, are applied
//! directly to a store no process owns). `taquba-workflow ui` serves the
//! same reads and commands as a web dashboard. On a cluster root (a
//! location holding a cluster record) every command works across the
//! shards ([`cluster`]).
//!
//! Exit codes: 0 success, 1 the command failed, 2 usage error.

mod bounded;
mod cli;
mod cluster;
mod commands;
mod error;
mod location;
mod output;
mod payload;
mod present;
mod session;
#[cfg(feature = "ui")]
mod ui;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version exit 0, usage errors 2 (clap's codes).
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("taquba-workflow: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("taquba-workflow: error: {e}");
            e.exit_code()
        }
    }
}
