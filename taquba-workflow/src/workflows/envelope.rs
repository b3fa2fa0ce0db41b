//! The stored shape of a `#[workflow]` run's payload (the envelope):
//! MessagePack with named fields of
//! `{ workflow: "<workflow name>", step: { "<step name>": { <fields> } } }`,
//! and the reads of its names without decoding the step's fields. A leaf:
//! the runtime's naming and the workflows module read it alike.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A run payload: the workflow's name and its step.
#[derive(Serialize)]
pub(crate) struct EnvelopeOut<'a, S> {
    pub(crate) workflow: &'a str,
    pub(crate) step: &'a S,
}

#[derive(Deserialize)]
pub(crate) struct EnvelopeIn<S> {
    pub(crate) step: S,
}

/// The names in a payload, read without decoding the step's fields.
#[derive(Deserialize)]
pub(crate) struct EnvelopeHead {
    pub(crate) workflow: String,
    pub(crate) step: StepTag,
}

/// The variant name of an externally tagged enum value.
pub(crate) struct StepTag(pub(crate) String);

impl<'de> Deserialize<'de> for StepTag {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = StepTag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a step: a map from the step's name to its parameters")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<StepTag, E> {
                Ok(StepTag(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<StepTag, A::Error> {
                let Some(name) = map.next_key::<String>()? else {
                    return Err(serde::de::Error::custom("an empty map names no step"));
                };
                map.next_value::<serde::de::IgnoredAny>()?;
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(StepTag(name))
            }
        }
        d.deserialize_any(Visitor)
    }
}
