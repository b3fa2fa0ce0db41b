//! A local-directory store seen from inside: when the object store is an
//! `object_store::local::LocalFileSystem` (recognized by what it displays,
//! `LocalFileSystem(file:///…)`), the paths written by others (the inbox)
//! are listed, read and deleted through directory handles opened one
//! component at a time without following links, instead of through the
//! store.
//!
//! `LocalFileSystem` follows links: its listing walks into a directory
//! link (a delete of what it lists removes files outside the store), ends
//! at the first name it cannot turn into a path (not UTF-8, a control
//! character) or a link loop, and its reads open whatever the name is (a
//! FIFO blocks the opener until someone writes to it). Here:
//!
//! - a directory is listed one level deep: only regular files are
//!   entries; links, directories, FIFOs, sockets, devices and names that
//!   are not valid object names are reported as skipped, never followed;
//! - a file is opened with `O_NOFOLLOW | O_NONBLOCK` relative to its
//!   directory's handle and read only if it is a regular file;
//! - a delete unlinks the name in its directory's handle (a link is
//!   removed, never what it points to);
//! - every directory on the way from the store's root is opened with
//!   `O_NOFOLLOW`, so a link in place of `inbox/` or `v1/` is refused,
//!   not followed.
//!
//! All of it is blocking file-system work: callers run it on
//! `tokio::task::spawn_blocking`.

//!
//! Elsewhere than on Unix no store is recognized as a local directory
//! (`LocalDir` has no values there), and the store's own calls are used.

use taquba::object_store::path::Path;

#[cfg(unix)]
pub(crate) use imp::LocalDir;

/// No store is a [`LocalDir`] here.
#[cfg(not(unix))]
#[derive(Debug, Clone)]
pub(crate) enum LocalDir {}

/// A regular file named directly in a listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalFile {
    /// Its object path.
    pub(crate) location: Path,
    /// Its name in the directory (a valid object name).
    pub(crate) name: String,
    /// Its size, in bytes.
    pub(crate) size: u64,
}

/// What [`LocalDir::list`] found in one directory.
#[derive(Debug, Default)]
pub(crate) struct LocalListing {
    /// The regular files, in directory order.
    pub(crate) files: Vec<LocalFile>,
    /// The other entries, each described (`"name" (a symbolic link)`).
    pub(crate) skipped: Vec<String>,
}

/// What [`LocalDir::stat`] found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LocalEntry {
    /// Nothing is there.
    Absent,
    /// A regular file: its identity (inode, modification time and size,
    /// as `LocalFileSystem`'s ETag) and size.
    File {
        /// Inode, modification time (ns) and size.
        identity: String,
        /// Bytes.
        size: u64,
    },
    /// Something that is not a regular file.
    Other {
        /// What it is: `"a FIFO"`.
        kind: &'static str,
        /// Its identity, as for a file.
        identity: String,
    },
}

#[cfg(not(unix))]
impl LocalDir {
    /// `None`: no store is recognized as a local directory here.
    pub(crate) fn of(_store: &dyn taquba::object_store::ObjectStore) -> Option<Self> {
        None
    }

    pub(crate) fn list(&self, _dir: &Path) -> std::io::Result<LocalListing> {
        match *self {}
    }

    pub(crate) fn stat(&self, _path: &Path) -> std::io::Result<LocalEntry> {
        match *self {}
    }

    pub(crate) fn read(&self, _path: &Path, _limit: u64) -> std::io::Result<Option<Vec<u8>>> {
        match *self {}
    }

    pub(crate) fn delete(&self, _path: &Path) -> std::io::Result<()> {
        match *self {}
    }

    pub(crate) fn create_below(&self, _prefix: &str) -> Result<std::path::PathBuf, BelowError> {
        match *self {}
    }
}

/// Why a directory below a local store's root could not be made ready.
#[derive(Debug)]
pub(crate) enum BelowError {
    /// A component on the way is a symbolic link (never followed).
    Link(std::path::PathBuf),
    /// A component is not a directory, or the file system failed.
    Io(std::io::Error),
}

#[cfg(unix)]
mod imp {
    use std::ffi::OsStr;
    use std::io::{self, Read};
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Component, PathBuf};

    use rustix::fd::OwnedFd;
    use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
    use taquba::object_store::ObjectStore;
    use taquba::object_store::path::{Path, PathPart};

    use super::{LocalEntry, LocalFile, LocalListing};

    /// The directory a local store keeps its objects in.
    #[derive(Debug, Clone)]
    pub(crate) struct LocalDir {
        /// The store's root as `LocalFileSystem` maps object paths to files.
        root: url::Url,
        /// The same root as a file-system path.
        root_path: PathBuf,
    }

    impl LocalDir {
        /// The directory of `store` when it is a `LocalFileSystem` (its
        /// `Display` is `LocalFileSystem(<root URL>)`); `None` for any other
        /// store, including one that wraps a local one.
        pub(crate) fn of(store: &dyn ObjectStore) -> Option<Self> {
            let shown = store.to_string();
            let root = shown.strip_prefix("LocalFileSystem(")?.strip_suffix(')')?;
            let root = url::Url::parse(root).ok()?;
            if root.scheme() != "file" {
                return None;
            }
            let root_path = root.to_file_path().ok()?;
            Some(Self { root, root_path })
        }

        /// The directory of object prefix `prefix` below the root, made one
        /// component at a time (created when missing); a component that is a
        /// link is refused, never followed.
        pub(crate) fn create_below(&self, prefix: &str) -> Result<PathBuf, super::BelowError> {
            let mut path = self.root_path.clone();
            for part in prefix.split('/').filter(|part| !part.is_empty()) {
                path.push(part);
                match std::fs::symlink_metadata(&path) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        return Err(super::BelowError::Link(path));
                    }
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => {
                        return Err(super::BelowError::Io(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("{} is not a directory", path.display()),
                        )));
                    }
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {
                        match std::fs::create_dir(&path) {
                            Ok(()) => {}
                            // Another process made it meanwhile: looked at
                            // again below.
                            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                                let meta = std::fs::symlink_metadata(&path)
                                    .map_err(super::BelowError::Io)?;
                                if meta.file_type().is_symlink() {
                                    return Err(super::BelowError::Link(path));
                                }
                            }
                            Err(err) => return Err(super::BelowError::Io(err)),
                        }
                    }
                    Err(err) => return Err(super::BelowError::Io(err)),
                }
            }
            Ok(path)
        }

        /// The file-system components of object path `path` below the root, as
        /// `LocalFileSystem` maps them (each object path part percent-decoded).
        fn components(&self, path: &Path) -> io::Result<Vec<std::ffi::OsString>> {
            let mut url = self.root.clone();
            url.path_segments_mut()
                .map_err(|()| io::Error::other("the store's root URL has no path"))?
                .pop_if_empty()
                .extend(path.parts());
            let full = url.to_file_path().map_err(|()| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{path} is not a file path"),
                )
            })?;
            let below = full.strip_prefix(&self.root_path).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{path} is outside the store"),
                )
            })?;
            below
                .components()
                .map(|c| match c {
                    Component::Normal(name) => Ok(name.to_os_string()),
                    other => Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{path} has the component {other:?}"),
                    )),
                })
                .collect()
        }

        /// Open the directory at `components` without following a link on
        /// the way (the root itself is the store's, and opened as configured).
        fn open_dir(&self, components: &[std::ffi::OsString]) -> io::Result<OwnedFd> {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let mut fd = rustix::fs::open(&self.root_path, flags, Mode::empty())?;
            for name in components {
                fd = rustix::fs::openat(
                    &fd,
                    name.as_os_str(),
                    flags | OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(|errno| refused_link(errno, name))?;
            }
            Ok(fd)
        }

        /// The directory holding `path` and the name of `path` in it.
        fn parent_of(&self, path: &Path) -> io::Result<(OwnedFd, std::ffi::OsString)> {
            let mut components = self.components(path)?;
            let name = components.pop().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the store's root is not a file",
                )
            })?;
            Ok((self.open_dir(&components)?, name))
        }

        /// The entries of the directory at `dir`, one level deep: an absent
        /// directory lists nothing.
        ///
        /// # Errors
        /// A directory on the way that is a link or not a directory
        /// (`ErrorKind::InvalidInput`, naming it); the file system's errors.
        pub(crate) fn list(&self, dir: &Path) -> io::Result<LocalListing> {
            let fd = match self.open_dir(&self.components(dir)?) {
                Ok(fd) => fd,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    return Ok(LocalListing::default());
                }
                Err(err) => return Err(err),
            };
            let mut listing = LocalListing::default();
            for entry in Dir::read_from(&fd)? {
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(errno) => {
                        listing
                            .skipped
                            .push(format!("an entry that could not be read ({errno})"));
                        continue;
                    }
                };
                let raw = entry.file_name().to_bytes();
                if raw == b"." || raw == b".." {
                    continue;
                }
                let shown = OsStr::from_bytes(raw).to_string_lossy().into_owned();
                let stat = rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW);
                let stat = match stat {
                    Ok(stat) => stat,
                    // Removed since the directory was read.
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(errno) => {
                        listing
                            .skipped
                            .push(format!("{shown:?} (cannot be inspected: {errno})"));
                        continue;
                    }
                };
                let kind = FileType::from_raw_mode(stat.st_mode);
                if kind != FileType::RegularFile {
                    listing
                        .skipped
                        .push(format!("{shown:?} ({})", kind_of(kind)));
                    continue;
                }
                let Ok(name) = std::str::from_utf8(raw) else {
                    listing
                        .skipped
                        .push(format!("{shown:?} (a name that is not UTF-8)"));
                    continue;
                };
                if PathPart::parse(name).is_err() {
                    listing
                        .skipped
                        .push(format!("{name:?} (a name with a control character)"));
                    continue;
                }
                if is_staged_upload(name) {
                    // A write in progress: `LocalFileSystem` renames it into
                    // place when it completes.
                    continue;
                }
                listing.files.push(LocalFile {
                    location: dir.clone().join(PathPart::from(name)),
                    name: name.to_string(),
                    size: u64::try_from(stat.st_size).unwrap_or(0),
                });
            }
            Ok(listing)
        }

        /// What is at object path `path`, without following a link or opening
        /// it.
        ///
        /// # Errors
        /// As [`list`](Self::list).
        pub(crate) fn stat(&self, path: &Path) -> io::Result<LocalEntry> {
            let (dir, name) = match self.parent_of(path) {
                Ok(found) => found,
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(LocalEntry::Absent),
                Err(err) => return Err(err),
            };
            match rustix::fs::statat(&dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => {
                    let kind = FileType::from_raw_mode(stat.st_mode);
                    let size = u64::try_from(stat.st_size).unwrap_or(0);
                    let identity = format!(
                        "{:x}-{}.{:09}-{size:x}",
                        stat.st_ino, stat.st_mtime, stat.st_mtime_nsec
                    );
                    if kind != FileType::RegularFile {
                        return Ok(LocalEntry::Other {
                            kind: kind_of(kind),
                            identity,
                        });
                    }
                    Ok(LocalEntry::File { identity, size })
                }
                Err(rustix::io::Errno::NOENT) => Ok(LocalEntry::Absent),
                Err(errno) => Err(errno.into()),
            }
        }

        /// The bytes of the regular file at `path`, at most `limit + 1` of them
        /// (so a caller sees that it is over `limit`); `None` when nothing is
        /// there.
        ///
        /// # Errors
        /// `ErrorKind::InvalidInput` naming what the path is when it is not a
        /// regular file (a link, a FIFO, a directory: never opened for
        /// reading); the file system's errors.
        pub(crate) fn read(&self, path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
            let (dir, name) = match self.parent_of(path) {
                Ok(found) => found,
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(err) => return Err(err),
            };
            // NONBLOCK: opening a FIFO for reading would wait for a writer.
            let flags = OFlags::RDONLY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::NOCTTY
                | OFlags::CLOEXEC;
            let fd = match rustix::fs::openat(&dir, name.as_os_str(), flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(errno) => return Err(refused_link(errno, &name)),
            };
            let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
            if kind != FileType::RegularFile {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{path} is {}, not a regular file", kind_of(kind)),
                ));
            }
            let mut bytes = Vec::new();
            std::fs::File::from(fd)
                .take(limit.saturating_add(1))
                .read_to_end(&mut bytes)?;
            Ok(Some(bytes))
        }

        /// Remove the name of `path` from its directory (a link is removed,
        /// not what it points to); an absent one is not an error.
        ///
        /// # Errors
        /// As [`list`](Self::list); a directory at `path` is not removed.
        pub(crate) fn delete(&self, path: &Path) -> io::Result<()> {
            let (dir, name) = match self.parent_of(path) {
                Ok(found) => found,
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(err) => return Err(err),
            };
            match rustix::fs::unlinkat(&dir, name.as_os_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                Err(errno) => Err(errno.into()),
            }
        }
    }

    /// `openat(…, O_NOFOLLOW)` fails with `ELOOP` on a link (and `ENOTDIR`
    /// with `O_DIRECTORY` on a non-directory): say so.
    fn refused_link(errno: rustix::io::Errno, name: &OsStr) -> io::Error {
        match errno {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{:?} is a link or not a directory: it is not followed",
                    name.to_string_lossy()
                ),
            ),
            other => other.into(),
        }
    }

    /// What a file of type `kind` is, for a log line.
    pub(crate) fn kind_of(kind: FileType) -> &'static str {
        match kind {
            FileType::RegularFile => "a regular file",
            FileType::Directory => "a directory",
            FileType::Symlink => "a symbolic link",
            FileType::Fifo => "a FIFO",
            FileType::Socket => "a socket",
            FileType::CharacterDevice => "a character device",
            FileType::BlockDevice => "a block device",
            _ => "a special file",
        }
    }

    /// `LocalFileSystem` stages a write as `{name}#{n}` beside its target.
    fn is_staged_upload(name: &str) -> bool {
        name.rsplit_once('#')
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::os::unix::fs::symlink;
        use taquba::object_store::local::LocalFileSystem;
        use taquba::object_store::memory::InMemory;

        fn local(dir: &std::path::Path) -> LocalDir {
            LocalDir::of(&LocalFileSystem::new_with_prefix(dir).unwrap()).expect("a local store")
        }

        #[test]
        fn only_a_local_file_system_is_recognized() {
            let dir = tempfile::tempdir().unwrap();
            let found = local(dir.path());
            assert_eq!(
                found.root_path,
                std::fs::canonicalize(dir.path()).unwrap(),
                "{found:?}"
            );
            assert!(LocalDir::of(&InMemory::new()).is_none());
        }

        #[test]
        fn listing_names_regular_files_and_follows_nothing() {
            let dir = tempfile::tempdir().unwrap();
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(outside.path().join("precious"), b"x").unwrap();
            let inbox = dir.path().join("p/inbox/v1");
            std::fs::create_dir_all(&inbox).unwrap();
            std::fs::write(inbox.join("a.msgpack"), b"abc").unwrap();
            std::fs::write(inbox.join("b.msgpack#3"), b"staged").unwrap();
            std::fs::write(inbox.join(OsStr::from_bytes(b"\xff\xfe.msgpack")), b"").unwrap();
            std::fs::write(inbox.join("a\nb"), b"").unwrap();
            std::fs::create_dir(inbox.join("sub")).unwrap();
            symlink(outside.path(), inbox.join("zz-link")).unwrap();
            symlink(outside.path().join("precious"), inbox.join("f.msgpack")).unwrap();
            symlink("..", inbox.join("loop")).unwrap();
            let store = local(dir.path());
            let listing = store.list(&Path::from("p/inbox/v1")).unwrap();
            let names: Vec<_> = listing.files.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names, ["a.msgpack"]);
            assert_eq!(listing.files[0].size, 3);
            assert_eq!(
                listing.files[0].location,
                Path::from("p/inbox/v1/a.msgpack")
            );
            let mut skipped = listing.skipped.clone();
            skipped.sort();
            assert_eq!(skipped.len(), 6, "{skipped:?}");
            for (needle, what) in [
                ("zz-link", "a symbolic link"),
                ("f.msgpack", "a symbolic link"),
                ("loop", "a symbolic link"),
                ("sub", "a directory"),
                ("a\\nb", "control character"),
                ("\u{fffd}\u{fffd}.msgpack", "not UTF-8"),
            ] {
                assert!(
                    skipped
                        .iter()
                        .any(|s| s.contains(needle) && s.contains(what)),
                    "{needle}: {skipped:?}"
                );
            }
            // Nothing is read or deleted through a link.
            let err = store
                .read(&Path::from("p/inbox/v1/f.msgpack"), 10)
                .unwrap_err();
            assert!(err.to_string().contains("not followed"), "{err}");
            store.delete(&Path::from("p/inbox/v1/f.msgpack")).unwrap();
            assert!(outside.path().join("precious").exists());
            let err = store.list(&Path::from("p/inbox/v1/zz-link")).unwrap_err();
            assert!(err.to_string().contains("not followed"), "{err}");
            assert!(
                store
                    .list(&Path::from("p/inbox/v1/missing"))
                    .unwrap()
                    .files
                    .is_empty()
            );
        }

        #[test]
        fn a_fifo_is_described_and_never_opened() {
            let dir = tempfile::tempdir().unwrap();
            let fifo = dir.path().join("touch");
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &fifo,
                FileType::Fifo,
                Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap();
            let store = local(dir.path());
            let path = Path::from("touch");
            assert!(matches!(
                store.stat(&path).unwrap(),
                LocalEntry::Other { kind: "a FIFO", .. }
            ));
            // Would block forever if it were opened as a FIFO reader waits.
            let err = store.read(&path, 10).unwrap_err();
            assert!(err.to_string().contains("a FIFO"), "{err}");
            std::fs::write(dir.path().join("file"), b"12345").unwrap();
            let file = Path::from("file");
            assert!(matches!(
                store.stat(&file).unwrap(),
                LocalEntry::File { size: 5, .. }
            ));
            assert_eq!(store.read(&file, 2).unwrap().unwrap(), b"123");
            assert_eq!(store.read(&file, 10).unwrap().unwrap(), b"12345");
            store.delete(&file).unwrap();
            assert_eq!(store.stat(&file).unwrap(), LocalEntry::Absent);
            assert_eq!(store.read(&file, 10).unwrap(), None);
        }
    }
}
