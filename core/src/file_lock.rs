//! Advisory file locks (`flock`) that die with their process: the output
//! lock of a job and the claim on a spill directory both rely on the
//! kernel dropping a lock when its holder exits, even by SIGKILL, so a
//! later process tells a dead holder's file from a live one's.

use std::fs::File;

/// Why [`try_lock`] did not take a lock.
#[derive(Debug)]
pub enum Locked {
    /// Another open file (another process, or another open of it in this
    /// one) holds it.
    Elsewhere,
    /// The file system or platform has no such locks (`EOPNOTSUPP`,
    /// `ENOSYS`, `EINVAL`; `ENOLCK`, as NFS mounted without its lock
    /// service says).
    Unsupported(std::io::Error),
    /// Locking failed for another reason (`EIO`, say): the lock's state
    /// is not known, so the caller must not act as if nobody held it.
    Failed(std::io::Error),
}

/// An exclusive `flock` on `file` (a file or a directory) without waiting,
/// held until every handle of that open file is closed. (Not
/// `File::try_lock`: Rust 1.89, past this workspace's minimum, and files
/// only.)
pub fn try_lock(file: &File) -> Result<(), Locked> {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        loop {
            // SAFETY: flock on a descriptor this `File` owns and keeps
            // open; it reads and writes no memory.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => Locked::Elsewhere,
                Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ENOLCK) => {
                    Locked::Unsupported(e)
                }
                _ => Locked::Failed(e),
            });
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        Err(Locked::Unsupported(std::io::Error::from(
            std::io::ErrorKind::Unsupported,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second open of a locked file finds it held; once the first
    /// handle closes, the lock is free again.
    #[test]
    fn a_lock_holds_until_its_file_closes() {
        let p = std::env::temp_dir().join(format!("braid-file-lock-{}", std::process::id()));
        let a = File::create(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(try_lock(&a).is_ok());
        let b = File::open(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(try_lock(&b), Err(Locked::Elsewhere)));
        drop(a);
        assert!(try_lock(&b).is_ok());
        let _ = std::fs::remove_file(&p);
    }
}
