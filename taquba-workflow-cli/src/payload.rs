//! Payload bytes in and out: a run's result or a signal is MessagePack for
//! `#[workflow]` runs and typed jobs (named fields), arbitrary bytes for a
//! hand-written runner. [`Decoded`] shows stored bytes as JSON when they
//! are one whole MessagePack value, else as text, else as hex;
//! [`encode_json`] turns a JSON payload into the MessagePack a typed step
//! decodes.

use serde::Serialize;

use crate::error::{CliError, CliResult};

/// Stored bytes, decoded for display.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "encoding", rename_all = "lowercase")]
pub enum Decoded {
    /// One whole MessagePack value, as JSON.
    Msgpack {
        /// The value.
        value: serde_json::Value,
    },
    /// UTF-8 text that is not one whole MessagePack value.
    Utf8 {
        /// The text.
        text: String,
    },
    /// Anything else, hex-encoded.
    Bytes {
        /// The bytes in lowercase hex.
        hex: String,
    },
}

impl Decoded {
    /// Decode `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        if let Some(value) = whole_msgpack(bytes) {
            return Decoded::Msgpack { value };
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => Decoded::Utf8 {
                text: text.to_string(),
            },
            Err(_) => Decoded::Bytes {
                hex: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            },
        }
    }

    /// The value as text: compact JSON, the text, or `0x…` hex.
    pub fn text(&self) -> String {
        match self {
            Decoded::Msgpack { value } => value.to_string(),
            Decoded::Utf8 { text } => text.clone(),
            Decoded::Bytes { hex } => format!("0x{hex}"),
        }
    }
}

// For the dashboard's pages.
#[cfg(feature = "ui")]
impl Decoded {
    /// The value as text for reading: indented JSON, the text, or `0x…`
    /// hex.
    pub fn pretty(&self) -> String {
        match self {
            Decoded::Msgpack { value } => {
                serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
            }
            other => other.text(),
        }
    }

    /// How the bytes were decoded, in words.
    pub fn encoding(&self) -> &'static str {
        match self {
            Decoded::Msgpack { .. } => "MessagePack, shown as JSON",
            Decoded::Utf8 { .. } => "UTF-8 text",
            Decoded::Bytes { .. } => "bytes, in hex",
        }
    }
}

/// `bytes` as JSON when they are exactly one MessagePack value (no
/// trailing bytes) that JSON can show.
fn whole_msgpack(bytes: &[u8]) -> Option<serde_json::Value> {
    if bytes.is_empty() {
        return None;
    }
    let mut cursor = std::io::Cursor::new(bytes);
    let value: serde_json::Value = {
        let mut de = rmp_serde::Deserializer::new(&mut cursor);
        serde::Deserialize::deserialize(&mut de).ok()?
    };
    (usize::try_from(cursor.position()).ok() == Some(bytes.len())).then_some(value)
}

/// A JSON payload as MessagePack with named fields, as
/// `WorkflowRuntime::signal_value` encodes a typed value.
///
/// # Errors
/// [`CliError::Usage`] naming `source` when the text is not JSON.
pub fn encode_json(text: &str, source: &str) -> CliResult<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| CliError::Usage(format!("{source} is not valid JSON: {e}")))?;
    rmp_serde::to_vec_named(&value)
        .map_err(|e| CliError::Usage(format!("{source} cannot be encoded as MessagePack: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Report {
        files: u32,
        path: String,
    }

    #[test]
    fn msgpack_results_show_as_json() {
        let bytes = rmp_serde::to_vec_named(&Report {
            files: 3,
            path: "/r.md".into(),
        })
        .unwrap();
        assert_eq!(Decoded::of(&bytes).text(), r#"{"files":3,"path":"/r.md"}"#);
    }

    #[cfg(feature = "ui")]
    #[test]
    fn pretty_json_is_indented_and_names_its_encoding() {
        let bytes = rmp_serde::to_vec_named(&Report {
            files: 3,
            path: "/r.md".into(),
        })
        .unwrap();
        let decoded = Decoded::of(&bytes);
        assert_eq!(
            decoded.pretty(),
            "{\n  \"files\": 3,\n  \"path\": \"/r.md\"\n}"
        );
        assert_eq!(decoded.encoding(), "MessagePack, shown as JSON");
        assert_eq!(Decoded::of(&[0xc1]).pretty(), "0xc1");
        assert_eq!(Decoded::of(&[0xc1]).encoding(), "bytes, in hex");
    }

    #[test]
    fn text_and_bytes_that_are_not_one_msgpack_value() {
        // "hello" starts with a MessagePack fixint, but has trailing bytes.
        assert_eq!(
            Decoded::of(b"hello"),
            Decoded::Utf8 {
                text: "hello".into()
            }
        );
        assert_eq!(Decoded::of(&[0xc1, 0xff]).text(), "0xc1ff");
        assert_eq!(Decoded::of(b"").text(), "");
    }

    #[test]
    fn json_signals_round_trip_to_what_a_typed_step_decodes() {
        let bytes = encode_json(r#"{"files": 3, "path": "p"}"#, "--json").unwrap();
        #[derive(serde::Deserialize, PartialEq, Debug)]
        struct Back {
            files: u32,
            path: String,
        }
        let back: Back = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            back,
            Back {
                files: 3,
                path: "p".into()
            }
        );
        let err = encode_json("{nope", "--json").unwrap_err();
        assert!(matches!(err, CliError::Usage(_)));
        assert!(
            err.to_string().contains("--json is not valid JSON"),
            "{err}"
        );
    }
}
