//! Exit notices: a launcher tells the ranks still running which ranks
//! have ended, so that a rank waiting at start-up for one that will never
//! come fails at once, naming it, instead of at its timeout (60 s).
//!
//! The launcher opens one pipe per rank and names its read end in that
//! rank's `BRAID_EXITS_FD`. When a rank's process ends, the launcher
//! writes one line, `"<rank> <ok> <status>\n"` (`ok` 1 for a success, 0
//! otherwise), to every other rank's pipe. A tcp rank reads them during
//! its start-up (`watch`): rank 0 fails the start-up when a rank that
//! has not joined has ended, and every other rank fails when rank 0 has
//! ended before it could connect.
//!
//! ```text
//!   rank 1 ends (status 0) before it connects
//!   launcher --"1 1 exit status: 0\n"--> rank 0's pipe
//!   rank 0: "rank 1 ended (exit status: 0) before it joined the job"
//!           -> Abort to every rank that joined; they fail naming it
//! ```
//!
//! Notices are hints: a full pipe drops one (the write end never blocks),
//! a rank that never reads its pipe (a program that is no tcp rank) only
//! leaves it full, and one that never got a pipe waits as before.

use crate::Rank;

/// The variable that names the read end of a rank's exit-notice pipe.
pub const EXITS_FD_ENV: &str = "BRAID_EXITS_FD";

/// The longest notice line read (a rank, a flag and an exit status take
/// well under it); a longer one is skipped.
const LINE_MAX: usize = 256;

/// A rank that ended, as its launcher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The rank.
    pub rank: Rank,
    /// Whether it exited with success.
    pub ok: bool,
    /// Its exit status, as the launcher writes it ("exit status: 0").
    pub status: String,
}

impl Ended {
    /// The notice's line.
    fn line(&self) -> String {
        format!("{} {} {}\n", self.rank, u8::from(self.ok), self.status)
    }

    /// Parses a notice's line (without its newline); `None` for anything
    /// else.
    fn parse(line: &str) -> Option<Ended> {
        let mut f = line.splitn(3, ' ');
        let rank = f.next()?.parse().ok()?;
        let ok = match f.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        let status = f.next().unwrap_or("").trim().to_string();
        Some(Ended { rank, ok, status })
    }
}

/// The launcher's end: per rank, the read end until the rank has started
/// (then closed here) and the write end (non-blocking).
#[cfg(unix)]
pub(crate) struct ExitNotices {
    pipes: Vec<Option<(Option<std::os::fd::OwnedFd>, std::fs::File)>>,
}

#[cfg(unix)]
impl ExitNotices {
    /// A pipe for each of `n` ranks (a rank whose pipe cannot be made gets
    /// none: it is told nothing, and waits as it did before).
    pub(crate) fn new(n: usize) -> ExitNotices {
        let pipes = (0..n)
            .map(|_| {
                let (read, write) = crate::pipe::launcher_pipe().ok()?;
                crate::pipe::set_nonblocking(&write).ok()?;
                Some((Some(read), std::fs::File::from(write)))
            })
            .collect();
        ExitNotices { pipes }
    }

    /// The read end's descriptor, for rank `rank` to inherit.
    pub(crate) fn read_fd(&self, rank: Rank) -> Option<i32> {
        use std::os::fd::AsRawFd;
        let (read, _) = self.pipes.get(rank as usize)?.as_ref()?;
        read.as_ref().map(|r| r.as_raw_fd())
    }

    /// Rank `rank` has been started (or failed to): the launcher's copy of
    /// its read end closes (a pipe whose rank has ended then takes no
    /// more notices).
    pub(crate) fn started(&mut self, rank: Rank) {
        if let Some(Some((read, _))) = self.pipes.get_mut(rank as usize) {
            drop(read.take());
        }
    }

    /// Tells every other rank that `ended` has ended; its own pipe closes.
    pub(crate) fn tell(&mut self, ended: &Ended) {
        use std::io::Write;
        if let Some(p) = self.pipes.get_mut(ended.rank as usize) {
            *p = None;
        }
        let line = ended.line();
        for (_, write) in self.pipes.iter().flatten() {
            // (One write of fewer than PIPE_BUF bytes: whole or not at all.
            // A full pipe, or one whose rank is gone, drops the notice.)
            let _ = (&*write).write(line.as_bytes());
        }
    }
}

/// Reads the notices of the pipe a launcher handed this rank (descriptor
/// `fd`, from [`EXITS_FD_ENV`]) on a task of the current runtime, and
/// sends each on the channel returned, with the task. `None` where `fd`
/// is no pipe (or off Unix): no notice comes.
pub(crate) fn watch(
    fd: i32,
) -> Option<(
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<Ended>,
)> {
    #[cfg(unix)]
    {
        use tokio::io::AsyncReadExt;
        let own = crate::pipe::inherited_pipe(fd)?;
        let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(own).ok()?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut line = Vec::new();
            // Past `LINE_MAX` without a newline: skipped to the next one.
            let mut skipping = false;
            let mut buf = [0u8; 512];
            loop {
                let n = match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    if b != b'\n' {
                        if line.len() < LINE_MAX {
                            line.push(b);
                        } else {
                            skipping = true;
                        }
                        continue;
                    }
                    let parsed = (!skipping)
                        .then(|| std::str::from_utf8(&line).ok().and_then(Ended::parse))
                        .flatten();
                    line.clear();
                    skipping = false;
                    // (No one listens once the start-up is over: the pipe
                    // is still read, so the launcher's writes never fail.)
                    if let Some(e) = parsed {
                        let _ = tx.send(e);
                    }
                }
            }
        });
        Some((task, rx))
    }
    #[cfg(not(unix))]
    {
        let _ = fd;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_and_garbage_is_none() {
        for e in [
            Ended {
                rank: 3,
                ok: true,
                status: "exit status: 0".into(),
            },
            Ended {
                rank: 0,
                ok: false,
                status: "signal: 9 (SIGKILL)".into(),
            },
        ] {
            let line = e.line();
            assert_eq!(Ended::parse(line.trim_end_matches('\n')), Some(e));
        }
        for bad in ["", "x 1 s", "1 2 s", "1", "-1 0 s"] {
            assert_eq!(Ended::parse(bad), None, "{bad:?}");
        }
    }

    /// Notices written by the launcher's end reach the rank's watcher, each
    /// rank's pipe getting the others' (not its own), over-long lines
    /// skipped.
    #[cfg(unix)]
    #[test]
    fn notices_reach_the_other_ranks() {
        use std::io::Write;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async {
            let mut notices = ExitNotices::new(3);
            let fds: Vec<i32> = (0..3)
                .map(|r| notices.read_fd(r).unwrap_or_else(|| panic!("pipe {r}")))
                .collect();
            let (_t0, mut rx0) = watch(fds[0]).unwrap_or_else(|| panic!("watch 0"));
            let (_t2, mut rx2) = watch(fds[2]).unwrap_or_else(|| panic!("watch 2"));
            for r in 0..3 {
                notices.started(r);
            }
            // Garbage on rank 0's pipe first: a line past the cap, then a
            // line that is no notice.
            if let Some(Some((_, w))) = notices.pipes.first() {
                let junk = format!("{}\nnonsense\n", "9".repeat(LINE_MAX * 2));
                let _ = (&*w).write(junk.as_bytes());
            }
            let one = Ended {
                rank: 1,
                ok: true,
                status: "exit status: 0".into(),
            };
            notices.tell(&one);
            let two = Ended {
                rank: 2,
                ok: false,
                status: "exit status: 3".into(),
            };
            notices.tell(&two);
            assert_eq!(rx0.recv().await, Some(one.clone()));
            assert_eq!(rx0.recv().await, Some(two));
            assert_eq!(rx2.recv().await, Some(one));
            // Rank 2's pipe closed when it ended: its watcher ends too.
            assert_eq!(rx2.recv().await, None);
        });
    }
}
