//! Progress of rank processes, summed where their launcher shows it.
//!
//! A launcher given a progress counter ([`LaunchSpec::progress`]) opens
//! one pipe, lets every rank inherit its write end and names it in
//! `BRAID_PROGRESS_FD`; a rank's [`ProgressReporter`] writes its latest
//! counts there as one line, `"<rank> <read> <written>\n"` (a single
//! write of fewer than `PIPE_BUF` bytes, so lines of several ranks never
//! mix). The launcher keeps each rank's latest counts and stores their
//! sums in its [`Progress`], which its progress bar reads.
//!
//! ```text
//!   rank 0 --"0 1200 0\n"--\
//!   rank 1 --"1 900 300\n"---> pipe --> launcher: read 2100, written 300
//! ```
//!
//! Reports are hints: a full pipe drops a report (the write end does not
//! block), and a launcher that is gone makes them fail quietly.
//!
//! [`LaunchSpec::progress`]: crate::launch::LaunchSpec::progress

#[cfg(unix)]
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Rank;

/// A job's progress: rows read and rows written (computed and passed to
/// the output), each summed over the ranks that report. A launcher's bar
/// reads it; the two counts tell reading from the work after it.
#[derive(Debug, Default)]
pub struct Progress {
    /// Rows read.
    pub read: AtomicU64,
    /// Rows written.
    pub written: AtomicU64,
}

/// The variable that names the write end of the launcher's progress pipe
/// in a rank's environment.
pub const PROGRESS_FD_ENV: &str = "BRAID_PROGRESS_FD";

/// A rank's channel to its launcher's progress counter.
#[derive(Debug)]
pub struct ProgressReporter {
    rank: Rank,
    #[cfg(unix)]
    pipe: std::fs::File,
}

impl ProgressReporter {
    /// The reporter of a rank process whose launcher asked for progress
    /// (`BRAID_PROGRESS_FD` and `BRAID_RANK` set, the descriptor open and
    /// a pipe); `None` otherwise, and always off Unix.
    pub fn from_env() -> Option<ProgressReporter> {
        let rank: Rank = std::env::var("BRAID_RANK").ok()?.trim().parse().ok()?;
        let fd: i32 = std::env::var(PROGRESS_FD_ENV).ok()?.trim().parse().ok()?;
        Self::open(rank, fd)
    }

    #[cfg(unix)]
    fn open(rank: Rank, fd: i32) -> Option<ProgressReporter> {
        let own = crate::pipe::inherited_pipe(fd)?;
        // Reports never block, whoever made the pipe (braid's launcher
        // sets the flag too).
        let _ = crate::pipe::set_nonblocking(&own);
        Some(ProgressReporter {
            rank,
            pipe: std::fs::File::from(own),
        })
    }

    #[cfg(not(unix))]
    fn open(_rank: Rank, _fd: i32) -> Option<ProgressReporter> {
        None
    }

    /// Reports this rank's counts so far, rows read and rows written (they
    /// replace the rank's earlier report). Never blocks; a report that
    /// does not fit is dropped.
    pub fn report(&self, read: u64, written: u64) {
        #[cfg(unix)]
        {
            use std::io::Write;
            let line = format!("{} {read} {written}\n", self.rank);
            let _ = (&self.pipe).write(line.as_bytes());
        }
        #[cfg(not(unix))]
        let _ = (self.rank, read, written);
    }
}

/// The launcher's end: the pipe's read end and write end (the latter for
/// the ranks to inherit, closed here once they all started).
#[cfg(unix)]
pub(crate) struct ProgressPipe {
    read: std::os::fd::OwnedFd,
    write: Option<std::os::fd::OwnedFd>,
}

#[cfg(unix)]
impl ProgressPipe {
    /// A new pipe ([`crate::pipe::launcher_pipe`]), the write end
    /// non-blocking.
    pub(crate) fn new() -> std::io::Result<ProgressPipe> {
        let (read, write) = crate::pipe::launcher_pipe()?;
        crate::pipe::set_nonblocking(&write)?;
        Ok(ProgressPipe {
            read,
            write: Some(write),
        })
    }

    /// The write end's descriptor, for the ranks (None once closed).
    pub(crate) fn write_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        self.write.as_ref().map(|w| w.as_raw_fd())
    }

    /// Closes the launcher's copy of the write end (every rank has its
    /// own) and sums the ranks' reports into `total` on a thread of its
    /// own until every copy is closed.
    pub(crate) fn collect(mut self, nranks: u32, total: Arc<Progress>) {
        drop(self.write.take());
        let read = std::fs::File::from(self.read);
        let _ = std::thread::Builder::new()
            .name("braid-progress".into())
            .spawn(move || sum_reports(std::io::BufReader::new(read), nranks, &total));
    }
}

/// The longest report line read (a rank and two counts take at most 52
/// bytes); longer lines are skipped without being held.
const LINE_MAX: u64 = 64;

/// One of [`Progress`]'s sums, kept as each rank's count changes.
struct Sum {
    counts: Vec<u64>,
    sum: u128,
}

impl Sum {
    /// Replaces rank `r`'s count (in range) and stores the new sum in
    /// `to`, saturated (u128: the sum itself never overflows).
    fn set(&mut self, r: usize, c: u64, to: &AtomicU64) {
        self.sum = self.sum - u128::from(self.counts[r]) + u128::from(c);
        self.counts[r] = c;
        to.store(
            u64::try_from(self.sum).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Reads `"<rank> <read> <written>"` lines until the end, keeping each
/// rank's latest counts and their sums in `total`; malformed lines, lines
/// longer than `LINE_MAX` and ranks out of range are skipped.
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) fn sum_reports(mut read: impl std::io::BufRead, nranks: u32, total: &Progress) {
    use std::io::{BufRead, Read};
    let sum = || Sum {
        counts: vec![0u64; nranks as usize],
        sum: 0,
    };
    let (mut reads, mut writes) = (sum(), sum());
    let mut line = Vec::new();
    loop {
        line.clear();
        // A read error ends the reports, as does the end of the pipe.
        match read.by_ref().take(LINE_MAX).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // Too long to be a report: skip to the end of the line. (A last
        // line cut short by the end of the pipe is read as it is.)
        if line.last() != Some(&b'\n') && line.len() as u64 == LINE_MAX {
            loop {
                line.clear();
                match read.by_ref().take(LINE_MAX).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line.last() == Some(&b'\n') => break,
                    Ok(_) => {}
                }
            }
            continue;
        }
        // A line that is not text is skipped.
        let Ok(line) = std::str::from_utf8(&line) else {
            continue;
        };
        let mut it = line.split_whitespace();
        let (Some(r), Some(c), Some(w), None) = (it.next(), it.next(), it.next(), it.next()) else {
            continue;
        };
        let (Ok(r), Ok(c), Ok(w)) = (r.parse::<usize>(), c.parse::<u64>(), w.parse::<u64>()) else {
            continue;
        };
        if r < nranks as usize {
            reads.set(r, c, &total.read);
            writes.set(r, w, &total.written);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rank's latest report counts once; lines that are not reports
    /// (or name a rank the job does not have) change nothing.
    #[test]
    fn the_sum_keeps_each_ranks_latest_count() {
        let text: &[u8] =
            b"0 10 1\n1 5 0\n0 30 4\nnonsense\n\xff\xfe 9 9\n7 1000 1\n1 x 1\n2 1 2\n1 9\n1 9 9 9\n";
        let total = Progress::default();
        sum_reports(text, 3, &total);
        let sums = |t: &Progress| {
            (
                t.read.load(Ordering::Relaxed),
                t.written.load(Ordering::Relaxed),
            )
        };
        assert_eq!(sums(&total), (30 + 5 + 1, 4 + 2));
        // Counts that would overflow their sum saturate.
        let big = format!("0 {m} 1\n1 {m} 2\n", m = u64::MAX);
        sum_reports(big.as_bytes(), 2, &total);
        assert_eq!(sums(&total), (u64::MAX, 3));
        // A line far longer than a report is skipped, whatever it holds,
        // and the reports around it still count; so does a last line
        // without its newline.
        let mut long = b"0 5 5\n".to_vec();
        long.extend(std::iter::repeat_n(b'7', 100_000));
        long.extend_from_slice(b" 3 3\n1 6 1\n0 2 0");
        sum_reports(long.as_slice(), 2, &total);
        assert_eq!(sums(&total), (6 + 2, 1));
    }

    /// A report written to the pipe reaches the sum; closing every write
    /// end ends the collector.
    #[cfg(unix)]
    #[test]
    fn reports_through_the_pipe_reach_the_total() {
        use std::os::fd::FromRawFd;
        let pipe = ProgressPipe::new().unwrap();
        let fd = pipe.write_fd().unwrap();
        // A rank's copy of the write end (as a child inherits it).
        // SAFETY: dup of a descriptor owned by `pipe`.
        let dup = unsafe { libc::dup(fd) };
        assert!(dup >= 0);
        let rank = ProgressReporter::open(1, dup).expect("a pipe");
        // (The reporter holds a copy of its own, as it would of an
        // inherited descriptor.)
        // SAFETY: `dup` is this test's and no longer used.
        unsafe { libc::close(dup) };
        let total = Arc::new(Progress::default());
        pipe.collect(2, total.clone());
        rank.report(42, 0);
        rank.report(7, 3);
        drop(rank);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while total.written.load(Ordering::Relaxed) != 3 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(total.read.load(Ordering::Relaxed), 7);
        assert_eq!(total.written.load(Ordering::Relaxed), 3);
        // Not a pipe, or a standard descriptor: no reporter.
        let path = std::env::temp_dir().join(format!("braid-progress-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(f);
        assert!(ProgressReporter::open(0, raw).is_none());
        // SAFETY: the descriptor is still open and owned by this test.
        drop(unsafe { std::fs::File::from_raw_fd(raw) });
        let _ = std::fs::remove_file(&path);
        assert!(ProgressReporter::open(0, 1).is_none());
    }
}
