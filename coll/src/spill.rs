//! Spill directories: where a shuffle writes the chunks that do not fit
//! under the host memory limit, and how they are cleaned up.
//!
//! ```text
//!   first spill:  mkdir TMP/braid-spill-new-<pid>-<n>-<random>   (0700)
//!                 open it, flock(LOCK_EX)        held while the process lives
//!                 rename it to TMP/braid-spill-<pid>-<n>-r<rank>-op<op>-<random>
//!   shuffle end:  remove it (and the process's exit path: remove_spill_dirs)
//!   first spill of a process: sweep TMP for braid-spill-[new-]<pid>-* whose
//!                 lock is free and whose process is gone (or a zombie),
//!                 and remove them
//! ```
//!
//! A process killed by SIGKILL cannot remove its directory, and a spill
//! may hold many GB; the kernel drops its `flock` with it, so the next
//! process that spills tells its directory from a live one's and removes
//! it. A directory gets its final name only once it is locked (the
//! rename keeps the lock), so a sweep never sees a live one unlocked. A
//! directory whose process still lives is kept even when unlocked (one of
//! a braid from before these locks).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use braid_core::file_lock::{Locked, try_lock};
use braid_core::{OpId, Rank};

/// The name every spill directory starts with.
const PREFIX: &str = "braid-spill-";
/// The name a spill directory has before it is locked.
const NEW_PREFIX: &str = "braid-spill-new-";

/// One shuffle's spill directory in the temp directory: named at once,
/// made on first use, removed when dropped.
pub(crate) struct SpillDir {
    path: PathBuf,
    /// The directory's open handle, holding its lock (`None` where the
    /// file system has no locks), once made; the error of making it.
    made: OnceLock<Result<Option<File>, String>>,
}

/// Numbers the spill directories of this process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A random number (std's hasher keys are random per process and
/// instance).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.load(Ordering::Relaxed));
    h.finish()
}

impl SpillDir {
    /// The directory of rank `rank`'s shuffle `op`: unique per shuffle of
    /// this process (contexts of one process, as tests and in-process
    /// ranks of two jobs, reuse OpIds, and one shuffle's clean-up must not
    /// remove another's files), with a random part that keeps the name
    /// from being guessed (and taken) in advance by another user of the
    /// temp directory.
    pub(crate) fn new(rank: Rank, op: OpId) -> SpillDir {
        let path = std::env::temp_dir().join(format!(
            "{PREFIX}{}-{}-r{rank}-op{}-{:016x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            op.0,
            random_u64()
        ));
        SpillDir {
            path,
            made: OnceLock::new(),
        }
    }

    /// The directory, made on first use: this process's own (created,
    /// never adopted: a name taken already fails), readable by this user
    /// only, locked for as long as this process lives.
    pub(crate) fn ready(&self) -> Result<&Path, String> {
        let made = self.made.get_or_init(|| {
            static SWEEP: Once = Once::new();
            SWEEP.call_once(|| sweep(&std::env::temp_dir()));
            let made = make_locked(&self.path).map_err(|e| format!("{}: {e}", self.path.display()));
            if made.is_ok() {
                live().push(self.path.clone());
            }
            made
        });
        match made {
            Ok(_) => Ok(&self.path),
            Err(e) => Err(e.clone()),
        }
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        // Only the directory this made (a name found taken is another's,
        // and stays); removed before its lock goes with the handle.
        if let Some(Ok(_)) = self.made.get() {
            let _ = std::fs::remove_dir_all(&self.path);
            live().retain(|d| *d != self.path);
        }
    }
}

/// Makes `path` as a locked directory: under a first name, locked, then
/// renamed to `path`.
fn make_locked(path: &Path) -> std::io::Result<Option<File>> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(PREFIX))
        .unwrap_or_default();
    let first = path.with_file_name(format!("{NEW_PREFIX}{name}"));
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&first)?;
    let locked = File::open(&first).and_then(|f| match try_lock(&f) {
        Ok(()) => Ok(Some(f)),
        Err(Locked::Unsupported(_)) => Ok(None),
        Err(Locked::Elsewhere) => Err(std::io::Error::other("locked by another process")),
        Err(Locked::Failed(e)) => Err(e),
    });
    let done = locked.and_then(|f| std::fs::rename(&first, path).map(|()| f));
    if done.is_err() {
        let _ = std::fs::remove_dir(&first);
    }
    done
}

/// Whether process `pid` of this host lives (or may: one that this user
/// cannot signal, or a pid that cannot be one).
fn process_lives(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        }
        // A zombie (killed, not yet reaped: a launcher's ranks for a second
        // or two after it was killed) has dropped its locks and is gone.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(')')
                .is_none_or(|(_, after)| !after.trim_start().starts_with('Z')),
            Err(_) => true,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Removes from `tmp` the spill directories of processes that are gone:
/// under either name, unlocked, and their process (the pid in the name,
/// as braid writes it: digits, no leading zero) no longer running. Says
/// what it removed in the log. Anything it cannot read or lock is left.
pub(crate) fn sweep(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let (mut removed, mut bytes) = (0u32, 0u64);
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name
            .strip_prefix(NEW_PREFIX)
            .or_else(|| name.strip_prefix(PREFIX))
        else {
            continue;
        };
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Some(pid) = rest.split('-').next().and_then(pid_of) else {
            continue;
        };
        let path = e.path();
        if process_lives(pid) {
            continue;
        }
        // Locked here while it is removed: a second sweep skips it.
        let Ok(f) = File::open(&path) else { continue };
        if try_lock(&f).is_ok() {
            let size = dir_bytes(&path);
            if std::fs::remove_dir_all(&path).is_ok() {
                removed += 1;
                bytes += size;
            }
        }
    }
    if removed > 0 {
        tracing::info!(
            "removed {removed} spill directories of braid processes that are gone \
             ({bytes} bytes) from {}",
            tmp.display()
        );
    }
}

/// A pid as braid writes it in a name: ASCII digits without a leading
/// zero (not `+12` or `012`, which `parse` takes).
fn pid_of(s: &str) -> Option<u32> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0');
    digits.then(|| s.parse().ok()).flatten()
}

/// The bytes of the files directly in `dir` (a spill directory holds
/// only files).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |es| {
        es.flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}

/// The spill directories this process's live shuffles made.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the spill directories of every shuffle of this process that
/// has not ended yet: for a process about to exit without waiting for
/// them (a stopped or failed job whose blocking work still holds a
/// shuffle's store; an MPI abort). Shuffles still running lose their
/// spilled chunks; call it only on the way out.
pub fn remove_spill_dirs() {
    for d in std::mem::take(&mut *live()) {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of a process that is gone (unlocked, its pid not
    /// running, or a zombie) is swept with its files, under either name; a
    /// live one (locked), one whose process runs, and names braid does not
    /// make stay, also where they hold a gone process's number.
    #[test]
    fn sweeps_remove_only_what_gone_processes_left() {
        let tmp = std::env::temp_dir().join(format!("braid-spill-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{e}"));
        let child = || {
            std::process::Command::new("true")
                .spawn()
                .unwrap_or_else(|e| panic!("{e}"))
        };
        // A pid that runs no process: a child that has exited and been
        // waited for.
        let dead = {
            let mut c = child();
            let _ = c.wait();
            c.id()
        };
        // A zombie: a child that has exited, not yet waited for.
        let mut zombie = child();
        let z = zombie.id();
        let t = std::time::Instant::now();
        while process_lives(z) && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let me = std::process::id();
        let live = SpillDir {
            path: tmp.join(format!("{PREFIX}{dead}-0-r0-op1-00")),
            made: OnceLock::new(),
        };
        let locked = make_locked(&live.path).unwrap_or_else(|e| panic!("{e}"));
        assert!(locked.is_some(), "this file system has no flock");
        let mk = |name: String| {
            let p = tmp.join(name);
            std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(p.join("chunk-0"), [7u8; 1000]).unwrap_or_else(|e| panic!("{e}"));
            p
        };
        let gone = [
            mk(format!("{PREFIX}{dead}-1-r0-op1-00")),
            mk(format!("{NEW_PREFIX}{dead}-3-r0-op1-00")),
            mk(format!("{PREFIX}{z}-4-r0-op1-00")),
        ];
        let kept = [
            mk(format!("{PREFIX}{me}-2-r0-op1-00")),
            mk(format!("{NEW_PREFIX}{me}-5-r0-op1-00")),
            mk("braid-spilled-notours".into()),
            mk(format!("{NEW_PREFIX}mydata")),
            mk(format!("{PREFIX}+{dead}-6-r0-op1-00")),
            mk(format!("{PREFIX}0{dead}-7-r0-op1-00")),
        ];
        sweep(&tmp);
        for p in &gone {
            assert!(!p.exists(), "{} was left", p.display());
        }
        for p in kept.iter().chain([&live.path]) {
            assert!(p.exists(), "{} was swept", p.display());
        }
        let _ = zombie.wait();
        // Once its handle is closed (the process gone), it goes too.
        drop(locked);
        sweep(&tmp);
        assert!(!live.path.exists());
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// A spill directory is made locked under its name on first use and
    /// removed with its files when dropped.
    #[test]
    fn a_spill_dir_is_made_on_first_use_and_removed_when_dropped() {
        let d = SpillDir::new(3, OpId(9));
        assert!(!d.path.exists());
        let p = d.ready().unwrap_or_else(|e| panic!("{e}")).to_path_buf();
        assert!(p.is_dir());
        std::fs::write(p.join("chunk-0"), b"x").unwrap_or_else(|e| panic!("{e}"));
        let f = File::open(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(try_lock(&f), Err(Locked::Elsewhere)), "not locked");
        drop(d);
        assert!(!p.exists());
    }
}
