//! A worker process of a cluster (the multi-process test,
//! `tests/cluster_processes.rs`): hosts shards of the cluster in
//! `--store` on bucket leases until SIGTERM. See
//! `taquba_workflow_suite::cluster_demo`.

use std::process::ExitCode;

use taquba_workflow_suite::cluster_demo::{WorkerArgs, worker};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match WorkerArgs::parse(&args) {
        Ok(args) => args,
        Err(err) => {
            eprintln!("cluster_worker: {err}");
            return ExitCode::from(2);
        }
    };
    match worker(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cluster_worker: {err}");
            ExitCode::FAILURE
        }
    }
}
