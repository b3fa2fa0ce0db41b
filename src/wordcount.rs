//! The word count shared by the `word_report` examples (the `#[workflow]`
//! form and the hand-written `StepRunner` form), so both count the same way.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Lines, words (whitespace-separated) and bytes of a text.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    /// Lines.
    pub lines: u64,
    /// Whitespace-separated words.
    pub words: u64,
    /// Bytes (of the text as decoded, invalid UTF-8 replaced).
    pub bytes: u64,
}

impl Counts {
    /// The counts of `text` (decoded as UTF-8, invalid bytes replaced).
    pub fn of(text: &[u8]) -> Self {
        let text = String::from_utf8_lossy(text);
        Self {
            lines: text.lines().count() as u64,
            words: text.split_whitespace().count() as u64,
            bytes: text.len() as u64,
        }
    }

    /// Add `other` to these counts.
    pub fn add(&mut self, other: Counts) {
        self.lines += other.lines;
        self.words += other.words;
        self.bytes += other.bytes;
    }
}

/// One counted file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileCounts {
    /// The file's path.
    pub path: String,
    /// Its counts.
    pub counts: Counts,
}

/// The `*.rs` and `*.md` files under `dir`, sorted, skipping `target` and
/// hidden directories.
///
/// # Errors
/// The file system's error for a directory that cannot be read.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if entry.file_type()?.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    pending.push(path);
                }
            } else if name.ends_with(".rs") || name.ends_with(".md") {
                files.push(path.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lines_words_and_bytes() {
        let mut total = Counts::of(b"one two\nthree\n");
        assert_eq!(
            total,
            Counts {
                lines: 2,
                words: 3,
                bytes: 14
            }
        );
        total.add(Counts::of(b"four"));
        assert_eq!(
            total,
            Counts {
                lines: 3,
                words: 4,
                bytes: 18
            }
        );
    }

    #[test]
    fn lists_sources_and_skips_target_and_hidden_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        for path in [
            "a.rs",
            "b.md",
            "c.txt",
            "target/d.rs",
            ".git/e.rs",
            "sub/f.rs",
        ] {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, b"x").expect("write");
        }
        let files = list_files(dir.path()).expect("listed");
        let names: Vec<_> = files
            .iter()
            .map(|f| {
                f.strip_prefix(&*dir.path().to_string_lossy())
                    .unwrap_or(f)
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["/a.rs", "/b.md", "/sub/f.rs"]);
    }
}
