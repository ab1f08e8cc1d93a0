//! One job at a time per output path, and names beside an output that
//! stay within a file system's 255 bytes.
//!
//! Two jobs writing the same output at once shared its staging area: one
//! removed or replaced the other's files, and the job that finished last
//! could commit a mixed directory or a truncated file and still succeed.
//! Rank 0 now holds a lock file beside the output (`flock`, taken before
//! the ranks agree on the job, so no rank stages anything without it): a
//! second job fails at once, naming the lock and the process that holds
//! it. The lock is the open file's, so a killed job's lock goes with its
//! process; the file is removed when the job ends.
//!
//! ```text
//!   open LOCK (create) -> try flock(exclusive)
//!     held by another process -> fail: "another job is writing OUTPUT"
//!     taken -> LOCK still names the locked file? (a job ending removes
//!              it: one opened before that removal locks a file nobody
//!              else will) -> else open again
//!   job runs, commits
//!   drop: remove LOCK, then close (unlock)
//! ```
//!
//! Where the file system has no locks (some network file systems), the
//! job runs without one, with a warning.

use std::fs::{File, OpenOptions};

use braid_core::file_lock::{Locked, try_lock};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// The most bytes in one file name (Linux, macOS, most file systems).
const NAME_MAX: usize = 255;

/// A path beside `path` (in its directory) named `prefix`, `path`'s file
/// name, then `suffix`. Where that would pass [`NAME_MAX`] bytes, the
/// name's first bytes, `~` and a hash of the whole name stand in for it
/// (the same on every rank and run); a path without a file name (`.`,
/// `/`) gets `prefix` + `braid` + `suffix` inside it.
pub(crate) fn beside(path: &Path, prefix: &str, suffix: &str) -> PathBuf {
    let Some(name) = path.file_name() else {
        return path.join(format!("{prefix}braid{suffix}"));
    };
    let name = name.to_string_lossy();
    let full = format!("{prefix}{name}{suffix}");
    if full.len() <= NAME_MAX {
        return path.with_file_name(full);
    }
    // "~" and 16 hex digits.
    let room = NAME_MAX.saturating_sub(prefix.len() + suffix.len() + 17);
    let mut cut = room.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let hash = fnv1a(name.as_bytes());
    path.with_file_name(format!("{prefix}{}~{hash:016x}{suffix}", &name[..cut]))
}

/// FNV-1a, 64 bits: stable across processes and builds (the ranks of a
/// job must derive the same names).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One job's hold on an output ([`crate::sink::FileSink::lock`]): the lock
/// file, locked while this lives; removed on drop.
#[derive(Debug)]
pub struct OutputLock {
    path: PathBuf,
    /// The locked file (`None`: the file system has no locks).
    file: Option<File>,
    /// Directories made to hold the lock (deepest first): removed on
    /// drop where still empty (a failed job's output directory).
    made: Vec<PathBuf>,
}

/// `dir` and those of its parents that do not exist, deepest first: what
/// making `dir` would make, for removing again ([`remove_made`]). None for
/// a path with `..` in it (`new/../old` names `old`, which may have
/// existed before), and only levels that are surely missing (not found).
pub(crate) fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    if dir
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Vec::new();
    }
    dir.ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .take_while(|a| {
            std::fs::symlink_metadata(a).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        })
        .map(Path::to_path_buf)
        .collect()
}

/// Makes `dir` and its missing parents, a level at a time; returns the
/// levels this call made, deepest first (a level another process made
/// meanwhile is not among them). On an error, what it made is removed.
pub(crate) fn make_dirs(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut made = Vec::new();
    let missing = missing_dirs(dir);
    if missing.is_empty() {
        // (Nothing missing, or a path with `..`: made as it is, recorded
        // as nothing.)
        std::fs::create_dir_all(dir)?;
        return Ok(made);
    }
    for level in missing.iter().rev() {
        match std::fs::create_dir(level) {
            Ok(()) => made.insert(0, level.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && level.is_dir() => {}
            Err(e) => {
                remove_made(&made);
                return Err(e);
            }
        }
    }
    Ok(made)
}

/// Removes the directories of [`missing_dirs`] that are empty, deepest
/// first (`remove_dir` leaves one that holds anything: a committed
/// output, another job's files; one already gone is passed over).
pub(crate) fn remove_made(made: &[PathBuf]) {
    for d in made {
        match std::fs::remove_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return,
        }
    }
}

impl OutputLock {
    /// Takes the lock at `path` for the output at `output` (named in the
    /// errors). Fails where another process holds it.
    pub(crate) fn acquire(path: PathBuf, output: &Path) -> Result<OutputLock> {
        // A lock taken on a file that its holder removed meanwhile is
        // retried on the new file; a few rounds settle any such race.
        for _ in 0..16 {
            let mut opts = OpenOptions::new();
            opts.create(true).truncate(false).read(true).write(true);
            // Never through a symbolic link: one planted at the lock's name
            // would have the job write over the file it names.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NOFOLLOW);
            // A lock file left by another user's job that was killed can
            // be locked through a read-only open (flock needs no write
            // access), as long as this user may read it.
            let opened = opts.open(&path).or_else(|e| {
                if e.kind() != std::io::ErrorKind::PermissionDenied {
                    return Err(e);
                }
                let mut ro = OpenOptions::new();
                ro.read(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::custom_flags(&mut ro, libc::O_NOFOLLOW);
                ro.open(&path).map_err(|_| e)
            });
            let mut file = opened.map_err(|e| {
                let link =
                    std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
                let why = if link {
                    "it is a symbolic link (remove it)".to_string()
                } else {
                    e.to_string()
                };
                DataError::file(
                    output,
                    format!("cannot open the output's lock {}: {why}", path.display()),
                )
            })?;
            match try_lock(&file) {
                Ok(()) => {}
                Err(Locked::Elsewhere) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    let holder = holder.trim();
                    let who = if holder.is_empty() {
                        String::new()
                    } else {
                        format!(", {holder}")
                    };
                    return Err(DataError::file(
                        output,
                        format!(
                            "another job is writing this output (it holds {}{who}); wait for it to end, or write elsewhere",
                            path.display()
                        ),
                    ));
                }
                Err(Locked::Failed(e)) => {
                    return Err(DataError::file(
                        output,
                        format!("cannot lock the output's lock {}: {e}", path.display()),
                    ));
                }
                Err(Locked::Unsupported(e)) => {
                    tracing::warn!(
                        "cannot lock {} ({e}): the job runs without keeping other jobs off its output",
                        path.display()
                    );
                    drop(file);
                    let _ = std::fs::remove_file(&path);
                    return Ok(OutputLock {
                        path,
                        file: None,
                        made: Vec::new(),
                    });
                }
            }
            if !names_file(&path, &file) {
                continue;
            }
            // Who holds it, for the error another job gives.
            let _ = file.set_len(0);
            let _ = write!(file, "process {} on {}", std::process::id(), host_name());
            return Ok(OutputLock {
                path,
                file: Some(file),
                made: Vec::new(),
            });
        }
        Err(DataError::file(
            output,
            format!(
                "cannot take the output's lock {}: other jobs keep replacing it",
                path.display()
            ),
        ))
    }

    /// Whether the lock is held (not where the file system has no locks).
    pub fn held(&self) -> bool {
        self.file.is_some()
    }

    /// This lock, removing on drop those of `made` (directories made for
    /// the output, deepest first) that are empty by then.
    pub(crate) fn with_made(mut self, made: Vec<PathBuf>) -> Self {
        self.made = made;
        self
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Removed while still locked: a job that opens it now finds it
        // gone once it has the lock, and opens a new one.
        if let Some(f) = self.file.take() {
            let _ = std::fs::remove_file(&self.path);
            drop(f);
        }
        remove_made(&self.made);
    }
}

/// Whether `path` still names the open `file` (same device and inode).
fn names_file(path: &Path, file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (path, file);
        true
    }
}

/// This host's name, for the lock's holder (empty where unknown).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn long_names_stay_within_the_limit_and_the_same() {
        let long = "b".repeat(248) + ".parquet";
        let p = Path::new("/tmp/x").join(&long);
        let s = beside(&p, "", ".braid-staging");
        let name = s.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.len() <= NAME_MAX, "{}", name.len());
        assert!(name.ends_with(".braid-staging") && name.starts_with("bbbb"));
        assert_eq!(s, beside(&p, "", ".braid-staging"));
        assert_eq!(s.parent(), p.parent());
        // Another long name gets another one.
        let other = Path::new("/tmp/x").join("b".repeat(247) + "c.parquet");
        assert_ne!(beside(&other, "", ".braid-staging"), s);
        // Multi-byte characters are cut whole.
        let wide = Path::new("d").join("é".repeat(200));
        let w = beside(&wide, ".", ".braid-replaced");
        assert!(w.file_name().unwrap().len() <= NAME_MAX);
        // Short names as they were.
        assert_eq!(
            beside(Path::new("out/f.csv"), ".", ".x"),
            Path::new("out/.f.csv.x")
        );
        assert_eq!(
            beside(Path::new("out/"), "", ".braid-lock"),
            Path::new("out.braid-lock")
        );
        assert_eq!(
            beside(Path::new("."), "", ".braid-lock"),
            Path::new("./braid.braid-lock")
        );
    }

    /// A symbolic link at the lock's name is refused, and the file it
    /// names is left as it was (the lock was opened through it and its
    /// holder's line written over that file).
    #[cfg(unix)]
    #[test]
    fn a_link_at_the_lock_is_refused() {
        let dir = std::env::temp_dir().join(format!("braid-lock-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, "precious").unwrap();
        let path = dir.join("out.braid-lock");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let e = OutputLock::acquire(path.clone(), &dir.join("out"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = std::env::temp_dir().join(format!("braid-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.braid-lock");
        let out = dir.join("out");
        let a = OutputLock::acquire(path.clone(), &out).unwrap();
        assert!(a.held());
        let e = OutputLock::acquire(path.clone(), &out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("another job") && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(a);
        assert!(!path.exists(), "the lock file is removed");
        let b = OutputLock::acquire(path.clone(), &out).unwrap();
        drop(b);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
