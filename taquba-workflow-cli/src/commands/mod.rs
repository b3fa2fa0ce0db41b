//! The commands: [`run`] opens the store and dispatches to each command's
//! module.

pub mod runs;
pub mod store_info;

use crate::cli::{Cli, Command, RunsCommand, StoreCommand};
use crate::error::{CliError, CliResult};
use crate::output::{Output, Times};
use crate::session::Session;

/// Run the parsed command line.
///
/// # Errors
/// The command's error.
pub async fn run(cli: Cli) -> CliResult<()> {
    let global = &cli.global;
    let out = Output::new(
        global.output,
        Times::new(global.time_format, Times::wall_clock_ms()),
    );
    let session = Session::open(global).await?;
    let result = dispatch(&cli, &session, &out).await;
    session.close().await;
    result
}

async fn dispatch(cli: &Cli, session: &Session, out: &Output) -> CliResult<()> {
    let global = &cli.global;
    match &cli.command {
        Command::Store(StoreCommand::Info) => store_info::info(session, out).await,
        Command::Runs(RunsCommand::Describe { id }) => {
            let runtime = session.runtime(global).await?;
            runs::describe(&runtime.view, id, out).await
        }
        Command::Runs(RunsCommand::Result { id, wait, timeout }) => {
            let runtime = session.runtime(global).await?;
            runs::result(&runtime.view, id, *wait, *timeout, out).await
        }
        _ => Err(CliError::Refused("not yet implemented".to_string())),
    }
}
