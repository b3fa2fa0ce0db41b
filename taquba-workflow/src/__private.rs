//! What the code `#[job]` and `#[workflow]` generate reaches, re-exported
//! from where each piece lives: the dependencies it needs (so the user's
//! crate needs none of its own), the registries (`jobs::registry`,
//! `workflows::registry`) and the bound checks and glue (`generated`).
//! Only re-exports. Not a public API: names here change without notice.

pub use ::inventory;
pub use ::rmp_serde;
pub use ::serde;

pub use crate::generated::job::{
    Classify, ClassifyOther, ClassifyProbe, ClassifyResult, FieldChecked, FieldProbe,
    FieldUnchecked, GeneratedJob, JobField, JobFieldOwned, JobFnError, JobOutput, JobReturn,
    JobRun, KeyPart, ProbeClone, ProbeCloneUnchecked, ProbeSerde, ProbeSerdeUnchecked,
    classify_with, key_part,
};
pub use crate::generated::step::{
    StepErrorProbe, StepErrorViaDisplay, StepErrorViaInto, StepField, StepFnError, StepReturn,
    ViaDisplay, ViaInto, decode_step, step_error_probe, step_future, step_outcome,
};
pub use crate::generated::{
    GeneratedInput, GeneratedJobStruct, GeneratedStepEnum, generated_input, generated_job_struct,
    generated_step_enum,
};
pub use crate::jobs::registry::{JobRegistration, register_job};
pub use crate::workflows::registry::{
    BoxStepFuture, ErasedWorkflow, MakeWithDefault, MakeWithoutDefault, Maker,
    WorkflowRegistration, hosted_workflow, workflow_code,
};
