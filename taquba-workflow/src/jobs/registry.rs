//! The registry of `#[job]`s linked into the binary (one `inventory`
//! entry each, which the macro writes) and
//! [`JobRunnerBuilder::register_all`], which registers them all; the check
//! that no two registrations share a name, which the workflow registry
//! shares.

use crate::jobs::{Job, JobRunnerBuilder};

/// One `#[job]` linked into the binary.
#[derive(Debug)]
pub struct JobRegistration {
    /// `Job::NAME`.
    pub name: &'static str,
    /// The generated struct's name.
    pub type_name: &'static str,
    /// `module_path!()` where the fn is.
    pub module_path: &'static str,
    /// `file!()` of the `#[job]` attribute.
    pub file: &'static str,
    /// `line!()` of the `#[job]` attribute.
    pub line: u32,
    /// Registers the type on a builder.
    pub register: fn(JobRunnerBuilder) -> JobRunnerBuilder,
}

inventory::collect!(JobRegistration);

/// `builder.register::<J>()`, as a fn pointer for [`JobRegistration`].
pub fn register_job<J: Job>(builder: JobRunnerBuilder) -> JobRunnerBuilder {
    builder.register::<J>()
}

fn job_registrations() -> Vec<&'static JobRegistration> {
    let mut all: Vec<_> = inventory::iter::<JobRegistration>.into_iter().collect();
    all.sort_by_key(|r| (r.name, r.file, r.line));
    all
}

/// Registration of every `#[job]`.
impl JobRunnerBuilder {
    /// Registers every `#[job]` linked into the binary (as
    /// [`register`](Self::register) does for one type); types registered
    /// by hand before are kept.
    ///
    /// # Panics
    /// When two `#[job]`s share a name (the message gives both source
    /// locations), or a type registered by hand has the name of a
    /// `#[job]`.
    pub fn register_all(self) -> Self {
        let registrations = job_registrations();
        if let Some(message) = duplicate_names(
            "#[job]",
            registrations
                .iter()
                .map(|r| (r.name, r.type_name, r.module_path, r.file, r.line)),
        ) {
            panic!("{message}");
        }
        registrations
            .into_iter()
            .fold(self, |builder, registration| {
                (registration.register)(builder)
            })
    }
}

/// The message for names registered twice, listing every location, or
/// `None`. `entries` is `(name, type, module, file, line)`.
pub(crate) fn duplicate_names<'a>(
    what: &str,
    entries: impl Iterator<Item = (&'a str, &'a str, &'a str, &'a str, u32)>,
) -> Option<String> {
    let mut by_name: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (name, type_name, module, file, line) in entries {
        by_name
            .entry(name)
            .or_default()
            .push(format!("`{module}::{type_name}` at {file}:{line}"));
    }
    let clashes: Vec<String> = by_name
        .into_iter()
        .filter(|(_, sites)| sites.len() > 1)
        .map(|(name, sites)| format!("`{name}` is the name of {}", sites.join(" and of ")))
        .collect();
    if clashes.is_empty() {
        None
    } else {
        Some(format!(
            "two {what}s share a name: {}; names must be unique, so give one of them another with `name = \"...\"`",
            clashes.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_name_every_location() {
        let message = duplicate_names(
            "#[job]",
            [
                ("a", "A", "m", "src/a.rs", 1),
                ("b", "B", "m", "src/b.rs", 2),
                ("a", "C", "n", "src/c.rs", 3),
            ]
            .into_iter(),
        )
        .expect("a clash");
        assert!(
            message.contains("`m::A` at src/a.rs:1 and of `n::C` at src/c.rs:3"),
            "{message}"
        );
        assert!(!message.contains("src/b.rs"));
        assert!(duplicate_names("#[job]", std::iter::empty()).is_none());
    }
}
