//! Changing code under running workflows: the *version* of the code a run
//! started on and each of its steps ran on, and *patches*, the way a step
//! branches on whether its run started before or after a change.
//!
//! # Versions
//!
//! A runner says what code it runs with [`StepRunner::code`]: a
//! [`CodeInfo`] per workflow name ([`HostedCode`]), with the code's version
//! (`#[workflow(version = "...")]`, by default the crate's
//! `CARGO_PKG_VERSION`). The runtime records
//!
//! * the version of the code that **submitted** the run (the run's start)
//!   in its run record, kept on its terminal record: `runs describe`,
//!   [`RunDetails::version`](crate::view::RunDetails::version),
//!   [`RunSummary::version`](crate::view::RunSummary::version), listed by
//!   [`RunFilter::version`](crate::view::RunFilter::version)
//!   (`runs list --version`);
//! * the version of the code that **settled** each step, in the step's
//!   history entry (only when it differs from the start version, so a run
//!   that never crosses a deploy pays nothing per step):
//!   [`StepHistory::version`](crate::history::StepHistory::version),
//!   `runs steps`.
//!
//! # Patches
//!
//! A patch is an id the code declares (`#[workflow(patches =
//! ["skip-slack-post"])]`, or [`CodeInfo::patch`] in a hand-written runner's
//! [`StepRunner::code`]). The set of patches the submitting code declared
//! is recorded in the run record **with the submission**, in the same
//! commit, and never changes for that run; [`Delivery::patched`] answers
//! from it:
//!
//! * `true` when the run started on code that declared the patch: every
//!   step of such a run, first attempt or retry, on any process, answers
//!   `true`;
//! * `false` when it started before (its recorded set lacks the patch, or
//!   it was submitted before runs recorded patches): such a run keeps the
//!   old path in every step, including steps it reaches only after the
//!   deploy, so a later step never assumes a change an earlier step of the
//!   run did not make.
//!
//! The answer is a function of the run record alone, so a retry, a
//! redelivery after a crash between the patch point and the step's
//! commit, or a restart of the process answers the same. Asking for a
//! patch the running code does not declare is a permanent step error
//! naming the patch (a typo would otherwise answer `false` forever).
//!
//! To retire a patch: once no active run lacks it
//! ([`RunFilter::lacks_patch`](crate::view::RunFilter::lacks_patch),
//! `runs list --status active --lacks-patch ID` lists none), the old branch
//! is dead code: remove it with the `patched` call. The declaration can go
//! in the same change or stay (harmless), never before the call (asking
//! for an undeclared patch is an error, and runs submitted without it
//! would take the old branch again).
//!
//! [`StepRunner::code`]: crate::StepRunner::code
//! [`Delivery::patched`]: crate::Delivery::patched

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::model::StepError;
use crate::run::context::failure;

/// What one workflow's code is: its version and the patches it declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodeInfo {
    /// The code's version (free text, at most 256 bytes kept), `None` when
    /// the runner does not say.
    pub version: Option<String>,
    /// The patch ids the code declares (see the [module doc](self)).
    pub patches: BTreeSet<String>,
}

impl CodeInfo {
    /// Code with no version and no patches.
    pub fn new() -> Self {
        Self::default()
    }

    /// This code, at `version`.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// This code, declaring the patch `id` too. An id is at most
    /// [`MAX_PATCH_ID_LEN`] bytes, and one code's ids at most
    /// [`MAX_PATCHES_SIZE`] bytes together: they are recorded on every run
    /// the code submits, so a runtime whose code breaks a limit refuses
    /// each submission with [`Error::InvalidCode`](crate::Error::InvalidCode)
    /// naming the patch, rather than record a run too large to end.
    pub fn patch(mut self, id: impl Into<String>) -> Self {
        self.patches.insert(id.into());
        self
    }
}

/// What a runner's code is, per workflow ([`StepRunner::code`](crate::StepRunner::code)):
/// the [`CodeInfo`] of each workflow (or job) by name, and the code of
/// every other run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostedCode {
    /// The code of runs whose workflow is not in `workflows` (a
    /// hand-written runner's runs, which name no workflow).
    pub any: CodeInfo,
    /// The code of each workflow, by its name.
    pub workflows: BTreeMap<String, CodeInfo>,
}

impl HostedCode {
    /// One code for every run.
    pub fn all(code: CodeInfo) -> Self {
        Self {
            any: code,
            workflows: BTreeMap::new(),
        }
    }

    /// The code of the workflow `name`.
    pub fn workflow(name: impl Into<String>, code: CodeInfo) -> Self {
        Self {
            any: CodeInfo::default(),
            workflows: BTreeMap::from([(name.into(), code)]),
        }
    }

    /// The code of the runs of `workflow` (`None`: a run naming none).
    pub fn of(&self, workflow: Option<&str>) -> &CodeInfo {
        workflow
            .and_then(|name| self.workflows.get(name))
            .unwrap_or(&self.any)
    }

    /// These workflows' code and `other`'s (a router of several).
    pub fn merge(mut self, other: HostedCode) -> Self {
        self.workflows.extend(other.workflows);
        self
    }
}

/// The longest version kept, in bytes (a longer one is cut).
pub(crate) const MAX_VERSION_LEN: usize = 256;

/// The longest patch id a code may declare, in bytes
/// ([`CodeInfo::patch`]): a runtime whose code declares a longer one
/// refuses every submission with [`Error::InvalidCode`](crate::Error::InvalidCode).
pub const MAX_PATCH_ID_LEN: usize = 256;

/// The most bytes of patch ids one workflow's code may declare, the ids'
/// lengths summed ([`CodeInfo::patch`]): a run records them all, in its
/// run record and its terminal record. Past it, a runtime refuses every
/// submission with [`Error::InvalidCode`](crate::Error::InvalidCode).
pub const MAX_PATCHES_SIZE: usize = 16 << 10;

/// What is wrong with `code` (the code of `whose`), if anything: a patch
/// id over [`MAX_PATCH_ID_LEN`] bytes, or ids over [`MAX_PATCHES_SIZE`]
/// bytes together.
fn code_problem(whose: &str, code: &CodeInfo) -> Option<String> {
    if let Some(id) = code.patches.iter().find(|id| id.len() > MAX_PATCH_ID_LEN) {
        return Some(format!(
            "{whose} declares patch {:?}… of {} bytes, over the {MAX_PATCH_ID_LEN} bytes a patch id may have",
            crate::history::cut_to(id, 32),
            id.len()
        ));
    }
    let size: usize = code.patches.iter().map(String::len).sum();
    (size > MAX_PATCHES_SIZE).then(|| {
        format!(
            "{whose} declares {} patches of {size} bytes together, over the {MAX_PATCHES_SIZE} bytes one code may declare",
            code.patches.len()
        )
    })
}

/// A runner's [`HostedCode`] as the runtime keeps it: each code behind an
/// `Arc`, so a step's [`RunCode`] shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct CodeTable {
    any: Arc<CodeInfo>,
    workflows: BTreeMap<String, Arc<CodeInfo>>,
    /// What breaks a limit in the hosted code (see [`code_problem`]), for
    /// every submission to refuse.
    problem: Option<String>,
}

impl CodeTable {
    pub(crate) fn new(hosted: HostedCode) -> Self {
        let problem = code_problem("the runner's code", &hosted.any).or_else(|| {
            hosted.workflows.iter().find_map(|(name, code)| {
                code_problem(&format!("the code of workflow {name:?}"), code)
            })
        });
        let keep = |mut code: CodeInfo| {
            code.version = code
                .version
                .map(|v| crate::history::cut_to(&v, MAX_VERSION_LEN));
            Arc::new(code)
        };
        Self {
            any: keep(hosted.any),
            workflows: hosted
                .workflows
                .into_iter()
                .map(|(name, code)| (name, keep(code)))
                .collect(),
            problem,
        }
    }

    /// Refuse a submission when the hosted code breaks a limit.
    ///
    /// # Errors
    /// [`Error::InvalidCode`](crate::Error::InvalidCode) naming the patch
    /// (or the size) and the workflow whose code declares it.
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        match &self.problem {
            Some(problem) => Err(crate::Error::InvalidCode(problem.clone())),
            None => Ok(()),
        }
    }

    /// The code of the runs of `workflow`.
    pub(crate) fn of(&self, workflow: Option<&str>) -> &Arc<CodeInfo> {
        workflow
            .and_then(|name| self.workflows.get(name))
            .unwrap_or(&self.any)
    }
}

/// One run's code as a step of it sees it ([`Delivery::code`](crate::Delivery::code)):
/// the version and patches the run started with, and the code running the
/// step.
#[derive(Debug, Clone, Default)]
pub struct RunCode {
    workflow: Option<String>,
    started_version: Option<String>,
    started_patches: Vec<String>,
    running: Arc<CodeInfo>,
}

impl RunCode {
    /// A run of `workflow` that started on `started` (its version and
    /// patches), running on `running`. The runtime builds it from the run
    /// record; tests of runners build one to drive [`patched`](Self::patched)
    /// (set it as [`Delivery::code`](crate::Delivery::code) of a
    /// [`Step::detached`](crate::Step::detached)).
    pub fn new(workflow: Option<&str>, started: &CodeInfo, running: &CodeInfo) -> Self {
        Self {
            workflow: workflow.map(str::to_string),
            started_version: started.version.clone(),
            started_patches: started.patches.iter().cloned().collect(),
            running: Arc::new(running.clone()),
        }
    }

    pub(crate) fn recorded(
        workflow: Option<&str>,
        started_version: Option<&str>,
        started_patches: &[String],
        running: Arc<CodeInfo>,
    ) -> Self {
        Self {
            workflow: workflow.map(str::to_string),
            started_version: started_version.map(str::to_string),
            started_patches: started_patches.to_vec(),
            running,
        }
    }

    /// Whether the run started on code that declared the patch `id`: see
    /// the [module doc](self). The same answer on every attempt of every
    /// step of the run, on any process.
    ///
    /// # Errors
    /// A permanent [`StepError`] naming the patch and the workflow when the
    /// running code does not declare `id` (add it to `#[workflow(patches =
    /// [...])]`, or to the runner's [`StepRunner::code`](crate::StepRunner::code)).
    pub fn patched(&self, id: &str) -> Result<bool, StepError> {
        if !self.running.patches.contains(id) {
            let declared: Vec<String> = self
                .running
                .patches
                .iter()
                .map(|p| format!("{p:?}"))
                .collect();
            let declared = match declared.is_empty() {
                true => "none".to_string(),
                false => declared.join(", "),
            };
            let whose = match &self.workflow {
                Some(name) => format!("workflow `{name}`"),
                None => "the runner".to_string(),
            };
            return Err(failure(format_args!(
                "patch {id:?} is not declared by {whose} (it declares {declared}): declare it with `#[workflow(patches = [{id:?}])]` or in `StepRunner::code`"
            )));
        }
        Ok(self.started_patches.iter().any(|p| p == id))
    }

    /// The patches the run started with, sorted (empty for a run submitted
    /// before runs recorded them).
    pub fn started_patches(&self) -> &[String] {
        &self.started_patches
    }

    /// The version of the code that submitted the run, when recorded.
    pub fn started_version(&self) -> Option<&str> {
        self.started_version.as_deref()
    }

    /// The version of the code running this step, when the runner says.
    pub fn version(&self) -> Option<&str> {
        self.running.version.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_answers_from_the_patches_it_started_with() {
        let v1 = CodeInfo::new().version("1");
        let v2 = CodeInfo::new().version("2").patch("skip-slack-post");
        let old = RunCode::new(Some("signup"), &v1, &v2);
        assert_eq!(old.patched("skip-slack-post"), Ok(false));
        assert_eq!(old.started_version(), Some("1"));
        assert_eq!(old.version(), Some("2"));
        let new = RunCode::new(Some("signup"), &v2, &v2);
        assert_eq!(new.patched("skip-slack-post"), Ok(true));
        assert_eq!(new.started_patches(), ["skip-slack-post"]);
        let err = new.patched("skip-slak-post").unwrap_err();
        assert_eq!(err.kind, crate::StepErrorKind::Permanent);
        assert!(
            err.message.contains("\"skip-slak-post\"")
                && err.message.contains("workflow `signup`")
                && err.message.contains("\"skip-slack-post\""),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_table_finds_a_workflow_or_falls_back() {
        let hosted = HostedCode::workflow("a", CodeInfo::new().version("x".repeat(300)))
            .merge(HostedCode::workflow("b", CodeInfo::new().patch("p")));
        assert_eq!(hosted.of(Some("b")).patches.len(), 1);
        assert_eq!(hosted.of(None), &CodeInfo::default());
        let table = CodeTable::new(hosted);
        assert!(
            table
                .of(Some("a"))
                .version
                .as_ref()
                .is_some_and(|v| v.len() <= MAX_VERSION_LEN)
        );
        assert!(table.of(Some("c")).version.is_none());
    }

    #[test]
    fn patch_limits_are_checked_per_id_and_per_code() {
        let at_limit = CodeInfo::new().patch("p".repeat(MAX_PATCH_ID_LEN));
        assert!(CodeTable::new(HostedCode::all(at_limit)).check().is_ok());

        let long =
            HostedCode::workflow("w", CodeInfo::new().patch("p".repeat(MAX_PATCH_ID_LEN + 1)));
        let err = CodeTable::new(long).check().unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, crate::Error::InvalidCode(_)), "{err:?}");
        assert!(
            message.contains("workflow \"w\"") && message.contains("257 bytes"),
            "{message}"
        );

        // 65 ids of 256 bytes: each within its limit, over the code's.
        let many = (0..65).fold(CodeInfo::new(), |code, i| {
            code.patch(format!("{i:03}{}", "p".repeat(MAX_PATCH_ID_LEN - 3)))
        });
        let message = CodeTable::new(HostedCode::all(many))
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("the runner's code declares 65 patches of 16640 bytes"),
            "{message}"
        );
    }
}
