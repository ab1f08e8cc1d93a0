//! The pipes between a launcher and its ranks (progress reports, exit
//! notices): made by the launcher above the standard descriptors, and
//! taken by a rank only where the descriptor it is told of is one.

#[cfg(unix)]
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A new pipe, `(read, write)`, both ends close-on-exec (a rank's command
/// clears that on the end it inherits) and above the standard descriptors
/// (a launcher started with one of them closed would get it for the
/// pipe, and a rank's stdout would then be taken for it).
#[cfg(unix)]
pub(crate) fn launcher_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into `fds` on success.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned here.
    let made = unsafe { [OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])] };
    // Copies at 3 or above, close-on-exec (pipe2 is not on every Unix);
    // the first ones close when `made` is dropped.
    let lift = |fd: &OwnedFd| -> std::io::Result<OwnedFd> {
        // SAFETY: fcntl duplicates a descriptor owned here.
        let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `n` was just made and nothing else holds it.
        Ok(unsafe { OwnedFd::from_raw_fd(n) })
    };
    Ok((lift(&made[0])?, lift(&made[1])?))
}

/// Sets `O_NONBLOCK` on a pipe end (the flag belongs to the pipe's shared
/// description: every holder of that end sees it).
#[cfg(unix)]
pub(crate) fn set_nonblocking(fd: &impl AsRawFd) -> std::io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl reads and sets the flags of a descriptor that is open
    // (borrowed from its owner for the call).
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == -1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A copy, owned by the caller and close-on-exec, of descriptor `fd` that
/// a launcher handed this process, where it is a pipe above the standard
/// descriptors (`None` otherwise: a descriptor of that number inherited
/// for another purpose is left alone). The inherited descriptor is made
/// close-on-exec (what this process starts does not get it: a child
/// holding a write end would keep the launcher waiting for its end) and
/// stays open, so several users in one process each close only their own.
#[cfg(unix)]
pub(crate) fn inherited_pipe(fd: i32) -> Option<OwnedFd> {
    // A launcher's pipe is never one of the standard descriptors
    // ([`launcher_pipe`] keeps it above them): a rank's stdout or stderr,
    // pipes too, is never taken for it.
    if fd < 3 {
        return None;
    }
    // SAFETY: fstat only reads the descriptor's metadata; a closed or
    // invalid one returns -1.
    let is_pipe = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
    };
    if !is_pipe {
        return None;
    }
    // SAFETY: fcntl sets a flag of a descriptor that is open (fstat said
    // so), then duplicates it; the copy is close-on-exec and owned from
    // here on.
    let own = unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3)
    };
    if own < 0 {
        return None;
    }
    // SAFETY: `own` was just made and nothing else holds it.
    Some(unsafe { OwnedFd::from_raw_fd(own) })
}
