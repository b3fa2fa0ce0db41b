//! [`WorkflowView::input`]: the input a run was submitted with, read back
//! from the payload of its step-0 job (the job whose id is the run's
//! execution tag), for tools that show a run to an operator.

use crate::error::Result;
use crate::store::keys::RunId;
use crate::view::WorkflowView;

impl WorkflowView {
    /// The input of `run_id`'s current execution, as submitted: the payload
    /// of its step-0 job (a `#[workflow]` run's start-step envelope, a job
    /// run's job input, a hand-written runner's bytes), while the queue
    /// keeps that job: while step 0 is the run's current step, and after
    /// it settled only on a queue whose `taquba::QueueConfig::keep_done_jobs`
    /// keeps done jobs (by default a done job is deleted when it settles).
    /// `None` otherwise, for a run never submitted or whose records
    /// retention removed, and for a run recorded before the runtime tagged
    /// executions. An offloaded payload is fetched.
    ///
    /// # Errors
    /// Storage and decoding errors (a payload object that is missing).
    pub async fn input(&self, run_id: &RunId) -> Result<Option<Vec<u8>>> {
        let execution = match self.run_record(run_id).await? {
            Some(record) => record.execution,
            None => match self.terminal_record(run_id).await? {
                Some(termination) => termination.execution,
                None => return Ok(None),
            },
        };
        let Some(job_id) = execution else {
            return Ok(None);
        };
        Ok(self.queue.get_job(&job_id).await?.map(|job| job.payload))
    }
}
