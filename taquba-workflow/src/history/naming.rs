//! Names read from payloads: the workflow (or job) a run's input belongs
//! to, recorded in the run record at submission, and the name of the step
//! a payload is, recorded in the step's history. A `#[workflow]` payload
//! is an envelope naming its workflow and step (read without decoding the
//! step's fields); a job run's input names its job type.

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::workflows::envelope::EnvelopeHead;

/// How a runtime's payloads name themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Naming {
    /// `#[workflow]` envelopes (any other payload names nothing).
    #[default]
    Envelopes,
    /// Job inputs of a [`JobRunner`](crate::jobs::JobRunner).
    Jobs,
}

/// The head of a job run's input: the job type's name (the job value is
/// skipped).
#[derive(Deserialize)]
struct JobHead {
    name: String,
    #[allow(dead_code)]
    payload: IgnoredAny,
}

impl Naming {
    /// The workflow (or job) `payload` belongs to.
    pub(crate) fn workflow_of(self, payload: &[u8]) -> Option<String> {
        match self {
            Naming::Envelopes => envelope(payload).map(|head| head.workflow),
            Naming::Jobs => job(payload),
        }
    }

    /// The name of the step `payload` is: the `#[step]` fn, or the job's
    /// name (a job run is one step).
    pub(crate) fn step_of(self, payload: &[u8]) -> Option<String> {
        match self {
            Naming::Envelopes => envelope(payload).map(|head| head.step.0),
            Naming::Jobs => job(payload),
        }
    }
}

/// The step name of `payload` of a run whose input named a workflow or
/// job, for a reader that does not know which kind of runtime wrote it.
pub(crate) fn step_of_named_run(payload: &[u8]) -> Option<String> {
    Naming::Envelopes
        .step_of(payload)
        .or_else(|| Naming::Jobs.step_of(payload))
}

fn envelope(payload: &[u8]) -> Option<EnvelopeHead> {
    rmp_serde::from_slice(payload).ok()
}

/// The job name a job run's input names.
pub(crate) fn job_name(payload: &[u8]) -> Option<String> {
    job(payload)
}

fn job(payload: &[u8]) -> Option<String> {
    rmp_serde::from_slice::<JobHead>(payload)
        .ok()
        .map(|head| head.name)
}

/// The longest workflow or step name recorded, in bytes.
pub(crate) const MAX_NAME_LEN: usize = 256;

/// The label of a runner type: the last path segment of its type name,
/// without generic arguments (`my_app::Pipeline<X>` is `Pipeline`).
pub(crate) fn runner_label<R>() -> String {
    let full = std::any::type_name::<R>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::durable::{self, DurableJobInput};

    #[test]
    fn names_come_from_envelopes_and_job_inputs_only() {
        #[derive(serde::Serialize)]
        struct Env<'a> {
            workflow: &'a str,
            step: std::collections::BTreeMap<&'a str, (u32,)>,
        }
        let env = rmp_serde::to_vec_named(&Env {
            workflow: "order",
            step: [("charge", (5,))].into(),
        })
        .unwrap();
        assert_eq!(
            Naming::Envelopes.workflow_of(&env).as_deref(),
            Some("order")
        );
        assert_eq!(Naming::Envelopes.step_of(&env).as_deref(), Some("charge"));
        assert_eq!(Naming::Jobs.step_of(&env), None);
        let job = durable::encode(&DurableJobInput {
            name: "math.add".into(),
            payload: vec![1, 2],
        });
        assert_eq!(Naming::Jobs.workflow_of(&job).as_deref(), Some("math.add"));
        assert_eq!(Naming::Envelopes.step_of(&job), None);
        assert_eq!(step_of_named_run(&job).as_deref(), Some("math.add"));
        assert_eq!(step_of_named_run(&env).as_deref(), Some("charge"));
        assert_eq!(Naming::Envelopes.step_of(b"raw bytes"), None);
        #[derive(serde::Serialize)]
        struct User<'a> {
            name: &'a str,
        }
        let user = rmp_serde::to_vec_named(&User { name: "alice" }).unwrap();
        assert_eq!(Naming::Jobs.step_of(&user), None);
    }

    #[test]
    fn runner_labels_are_the_last_segment() {
        struct Pipeline<T>(T);
        let _ = Pipeline(());
        assert_eq!(runner_label::<Pipeline<String>>(), "Pipeline");
        assert_eq!(runner_label::<u8>(), "u8");
    }
}
