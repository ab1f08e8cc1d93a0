//! Shared pieces of braid's integration tests: deterministic payloads that
//! a receiver can check without a copy of what was sent, message plans, and
//! the all-pairs exchange job used by both the in-process tests and the
//! worker processes of the tcp tests.

use std::sync::Arc;

use braid_core::{Buffer, CommError, Communicator, OpId, Rank, Tag};

/// SplitMix64: a tiny, good-enough PRNG so payloads need no extra crate.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Mixes several numbers into one seed.
pub fn seed_of(parts: &[u64]) -> u64 {
    let mut s = SplitMix(0x1234_5678);
    let mut acc = 0u64;
    for p in parts {
        s.0 ^= p.wrapping_mul(0x2545_f491_4f6c_dd1d);
        acc ^= s.next_u64();
    }
    acc
}

/// `len` pseudo-random bytes determined by `seed`.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut g = SplitMix(seed);
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&g.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = g.next_u64().to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
    v
}

/// Whether `data` is exactly `payload(seed, data.len())`, and if not, the
/// first differing offset.
pub fn check_payload(seed: u64, data: &[u8]) -> Result<(), usize> {
    let mut g = SplitMix(seed);
    let mut chunks = data.chunks_exact(8);
    let mut off = 0;
    for c in &mut chunks {
        if c != g.next_u64().to_le_bytes() {
            return Err(off);
        }
        off += 8;
    }
    let rest = chunks.remainder();
    let last = g.next_u64().to_le_bytes();
    if rest != &last[..rest.len()] {
        return Err(off);
    }
    Ok(())
}

/// Tags an exchange interleaves its messages over.
pub const EXCHANGE_TAGS: u8 = 3;
/// Messages per ordered pair of ranks.
pub const MSGS_PER_PAIR: u64 = 4;
/// The largest message of an exchange (sent once, from rank 0 to the last
/// rank).
pub const MAX_MSG: usize = 64 << 20;

/// The size of message `i` from `src` to `dst` in an exchange of `nranks`.
/// Sizes spread log-uniformly over 0 B .. 16 MiB, with some empty messages,
/// and one message of [`MAX_MSG`].
pub fn exchange_size(seed: u64, nranks: u32, src: Rank, dst: Rank, i: u64) -> usize {
    if src == 0 && dst == nranks - 1 && i == 1 {
        return MAX_MSG;
    }
    let mut g = SplitMix(seed_of(&[seed, src as u64, dst as u64, i, 1]));
    match g.below(8) {
        0 => 0,
        _ => {
            let exp = g.below(25);
            let base = 1u64 << exp;
            (base + g.below(base)) as usize / 2
        }
    }
}

/// The tag of message `i` of an exchange.
pub fn exchange_tag(i: u64) -> Tag {
    Tag::new(OpId(7), (i % EXCHANGE_TAGS as u64) as u8)
}

/// The seed of the bytes of message `i` from `src` to `dst`.
pub fn exchange_seed(seed: u64, src: Rank, dst: Rank, i: u64) -> u64 {
    seed_of(&[seed, src as u64, dst as u64, i, 2])
}

/// What one rank saw in an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeSummary {
    /// Messages received and checked.
    pub messages: u64,
    /// Bytes received and checked.
    pub bytes: u64,
}

/// The summary a rank should report: computed from the plan alone.
pub fn expected_summary(seed: u64, nranks: u32, rank: Rank) -> ExchangeSummary {
    let mut s = ExchangeSummary {
        messages: 0,
        bytes: 0,
    };
    for src in 0..nranks {
        for i in 0..MSGS_PER_PAIR {
            s.messages += 1;
            s.bytes += exchange_size(seed, nranks, src, rank, i) as u64;
        }
    }
    s
}

/// Every ordered pair of ranks (self included) exchanges
/// [`MSGS_PER_PAIR`] messages of planned sizes over interleaved tags. Each
/// rank checks every byte it receives and the per-(src, tag) order (message
/// `i`'s bytes are unique to `i`), receiving in an order unlike the sending
/// order.
pub async fn exchange(comm: Arc<dyn Communicator>, seed: u64) -> Result<ExchangeSummary, String> {
    let (rank, n) = (comm.rank(), comm.nranks());
    let mut sends = Vec::new();
    for k in 0..n {
        let dst = (rank + k) % n;
        for i in 0..MSGS_PER_PAIR {
            let len = exchange_size(seed, n, rank, dst, i);
            let data = payload(exchange_seed(seed, rank, dst, i), len);
            sends.push(comm.send(dst, exchange_tag(i), Buffer::from_vec(data)));
        }
    }
    let mut recvs = Vec::new();
    for k in 0..n {
        // Receive from sources in the opposite rotation, tags last-first.
        let src = (rank + n - k) % n;
        for t in (0..EXCHANGE_TAGS).rev() {
            let comm = comm.clone();
            recvs.push(tokio::spawn(async move {
                let mut s = ExchangeSummary {
                    messages: 0,
                    bytes: 0,
                };
                for i in (0..MSGS_PER_PAIR).filter(|i| i % EXCHANGE_TAGS as u64 == t as u64) {
                    let buf = comm
                        .recv(src, exchange_tag(i))
                        .await
                        .map_err(|e| e.to_string())?;
                    let want = exchange_size(seed, n, src, rank, i);
                    if buf.len() != want {
                        return Err(format!(
                            "rank {rank}: message {i} from {src}: {} bytes, expected {want}",
                            buf.len()
                        ));
                    }
                    check_payload(exchange_seed(seed, src, rank, i), buf.as_slice()).map_err(
                        |off| format!("rank {rank}: message {i} from {src}: byte {off} differs"),
                    )?;
                    s.messages += 1;
                    s.bytes += buf.len() as u64;
                }
                Ok::<_, String>(s)
            }));
        }
    }
    for s in sends {
        s.await.map_err(|e: CommError| e.to_string())?;
    }
    let mut total = ExchangeSummary {
        messages: 0,
        bytes: 0,
    };
    for r in recvs {
        let s = r.await.map_err(|e| e.to_string())??;
        total.messages += s.messages;
        total.bytes += s.bytes;
    }
    Ok(total)
}

/// The runtime the tests drive their ranks on (2 worker threads, like CI's
/// 2 cores).
#[allow(clippy::expect_used)] // a test cannot run without its runtime
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The contexts of an `n`-rank tcp job whose ranks all live in this
/// process (the tcp backend's full code path over loopback). Call inside a
/// multi-threaded runtime.
#[allow(clippy::expect_used)] // a test cannot run without its world
pub async fn tcp_contexts(n: u32, limits: braid_core::MemoryLimits) -> Vec<braid_core::Context> {
    braid_core::comm::tcp::TcpComm::in_process_world(n)
        .await
        .expect("tcp world")
        .into_iter()
        .map(|c| braid_core::world::context_for(Arc::new(c) as Arc<dyn Communicator>, limits))
        .collect()
}

/// Shuts every rank down cleanly (all ranks at once: shutdown is a
/// job-wide barrier) and panics on a failure.
#[allow(clippy::panic)]
pub async fn shutdown_all(ctxs: &[braid_core::Context]) {
    let downs: Vec<_> = ctxs.iter().map(|c| c.comm().shutdown()).collect();
    for (r, d) in futures::future::join_all(downs)
        .await
        .into_iter()
        .enumerate()
    {
        if let Err(e) = d {
            panic!("rank {r}: shutdown failed: {e}");
        }
    }
}

/// Rank counts every multi-rank test covers.
pub const RANK_COUNTS: [u32; 6] = [1, 2, 3, 4, 5, 8];

/// Day count `day` (days since 1970-01-01) moved to the 28th + `extra`
/// (0 to 3) of its month when it falls before the 28th, by chrono's
/// calendar (a day past a short month's end spills into the next): rows
/// where a month back is clamped, for calendar-window tests. Days outside
/// chrono's range stay as they are.
pub fn toward_month_end(day: i64, extra: i64) -> i64 {
    use chrono::Datelike;
    let date = day
        .checked_add(719_163)
        .and_then(|ce| i32::try_from(ce).ok())
        .and_then(chrono::NaiveDate::from_num_days_from_ce_opt);
    match date {
        Some(d) if d.day() < 28 => day + 28 - i64::from(d.day()) + extra,
        _ => day,
    }
}

/// A fresh seed per run (`BRAID_TEST_SEED` repeats one), printed so that
/// a failure can be reproduced.
pub fn fresh_seed() -> u64 {
    let s = std::env::var("BRAID_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("seed {s} (BRAID_TEST_SEED={s} repeats this run)");
    s
}

/// A test's scratch folder under the system temp dir, removed when the
/// guard drops. A failing test (dropped while panicking) keeps it and says
/// where, so its files can be looked at; a passing one leaves nothing (the
/// oracle tests write hundreds of MB, and CI's disk is not large).
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    /// A fresh, empty folder named for the test and this process.
    #[allow(clippy::expect_used)] // a test cannot run without its folder
    pub fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("braid-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create the scratch folder");
        Self(d)
    }

    /// The folder.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: its files are kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Runs `cmd` to its end and returns its status and output, as
/// [`std::process::Command::output`] does, but waits at most `limit`: a
/// command still running then is stopped (SIGTERM, SIGKILL 5 s later) and
/// the test fails with what it printed so far. A launcher that hangs fails
/// its test instead of running until CI's time is up (Open MPI 4.1's
/// mpirun once hung in its own finalise after its ranks had exited).
#[allow(clippy::expect_used, clippy::panic)] // a test fails by panicking
pub fn output_within(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    // Readers append as bytes come, so that a stopped command's output
    // so far can be shown (a process it left may hold a pipe open).
    let drain = |mut r: Box<dyn Read + Send>| {
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 1 << 16];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                g.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&buf[..n]);
            }
        });
        (got, t)
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let take = |(got, t): &(Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>)| {
        let t0 = Instant::now();
        while !t.is_finished() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::mem::take(&mut *got.lock().unwrap_or_else(|p| p.into_inner()))
    };
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for the command") {
            return std::process::Output {
                status,
                stdout: take(&out),
                stderr: take(&err),
            };
        }
        if t0.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t1 = Instant::now();
    while child.try_wait().ok().flatten().is_none() && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "{cmd:?} still ran after {limit:?}; stopped. Its output so far:\n{}\n{}",
        String::from_utf8_lossy(&take(&out)),
        String::from_utf8_lossy(&take(&err))
    );
}

/// The numbers after `prefix` on the first line of `out` that starts with
/// it (a worker's summary: `exchange ok 12 3456` gives 12 and 3456).
pub fn line_values(out: &str, prefix: &str) -> Option<Vec<u64>> {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
}

/// Reads `r` to its end on a thread of its own (a child's stdout or
/// stderr: a full pipe would stop the child) and returns what it read,
/// as text, when joined; a read error ends it early.
pub fn read_in_background(
    mut r: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// The process ids of the first `n` `ready PID` lines read from `out` (a
/// worker in `wait` mode prints one), or those that came within `limit`:
/// a job that hangs before it is ready does not hold the test.
pub fn ready_pids(
    out: impl std::io::Read + Send + 'static,
    n: usize,
    limit: std::time::Duration,
) -> Vec<u32> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Some(pid) = line.trim().strip_prefix("ready ") {
                if tx.send(pid.parse::<u32>().unwrap_or(0)).is_err() {
                    break;
                }
            }
        }
    });
    let deadline = std::time::Instant::now() + limit;
    let mut pids = Vec::new();
    while pids.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(p) => pids.push(p),
            Err(_) => break,
        }
    }
    pids
}

/// Waits for `c` to end; where it still runs `limit` after `since`, kills
/// it and fails the test, saying `what` it waited for.
#[allow(clippy::expect_used, clippy::panic)] // a test fails by panicking
pub fn exit_within(
    c: &mut std::process::Child,
    since: std::time::Instant,
    limit: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    loop {
        if let Some(s) = c.try_wait().expect("try_wait") {
            return s;
        }
        if since.elapsed() > limit {
            let _ = c.kill();
            panic!("{what}: still running {limit:?} later");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits for `c` (stderr piped) to exit, within `limit` of `since`, and
/// checks that it failed; returns what it wrote to stderr.
#[allow(clippy::expect_used, clippy::panic)] // a test fails by panicking
pub fn failed_within(
    c: &mut std::process::Child,
    since: std::time::Instant,
    limit: std::time::Duration,
    what: &str,
) -> String {
    use std::io::Read;
    let status = exit_within(c, since, limit, what);
    let mut err = String::new();
    c.stderr
        .as_mut()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    assert!(!status.success(), "{what}: should fail, stderr: {err}");
    err
}

/// Rank processes in `wait` mode (stdout and stderr piped): once each has
/// printed `ready`, kills rank `victim` and checks that every other rank
/// fails within `limit`, its error naming the victim (`peer rank V died`).
#[allow(clippy::expect_used, clippy::panic)] // a test fails by panicking
pub fn killed_rank_is_named(
    ranks: &mut [std::process::Child],
    victim: usize,
    limit: std::time::Duration,
) {
    for (r, c) in ranks.iter_mut().enumerate() {
        let out = c.stdout.take().expect("stdout");
        assert_eq!(ready_pids(out, 1, limit).len(), 1, "rank {r} is not ready");
    }
    ranks[victim].kill().expect("kill");
    let killed_at = std::time::Instant::now();
    for (r, c) in ranks.iter_mut().enumerate() {
        if r == victim {
            let _ = c.wait();
            continue;
        }
        let what = format!("rank {r}, rank {victim} killed");
        let err = failed_within(c, killed_at, limit, &what);
        assert!(
            err.contains(&format!("peer rank {victim} died")),
            "rank {r}'s error should name rank {victim}: {err}"
        );
    }
}

/// Writes a random Parquet input for the rolling job
/// (`tests/oracle/gen_input.py`: id, ts, key, v, w).
#[allow(clippy::expect_used)] // a test fails by panicking
pub fn gen_input(path: &std::path::Path, rows: u64, keys: u64, span: u64, seed: u64) {
    let st = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle/gen_input.py"))
        .arg(path)
        .args(["--rows", &rows.to_string(), "--keys", &keys.to_string()])
        .args(["--span", &span.to_string(), "--seed", &seed.to_string()])
        .status()
        .expect("run python3");
    assert!(
        st.success(),
        "gen_input.py failed (needs python3 with pyarrow or polars)"
    );
}

pub mod coll_suite;
#[cfg(feature = "cuda")]
pub mod gpu_suite;
pub mod graph_suite;
pub mod hosts;

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// A command that ends in time gives its status and both outputs
    /// whole; one that runs past the limit is stopped and fails the test
    /// at the limit, with its output so far.
    #[test]
    fn output_within_gives_the_output_or_stops_the_command() {
        let o = super::output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(60),
        );
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(
            (&o.stdout[..], &o.stderr[..]),
            (&b"out\n"[..], &b"err\n"[..])
        );
        let t = Instant::now();
        let stopped = std::panic::catch_unwind(|| {
            super::output_within(
                Command::new("sh").args(["-c", "echo started; exec sleep 60"]),
                Duration::from_millis(500),
            )
        });
        let msg = stopped.err().and_then(|p| p.downcast::<String>().ok());
        assert!(
            msg.as_deref().is_some_and(|m| m.contains("started")),
            "{msg:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    }

    #[test]
    fn toward_month_end_lands_on_the_28th_or_later() {
        // 2024-02-10 is day 19_763; 2024-02-28 is 19_781, 2024-03-02 is 19_784.
        assert_eq!(super::toward_month_end(19_763, 0), 19_781);
        assert_eq!(super::toward_month_end(19_763, 3), 19_784);
        // Already the 29th: unchanged.
        assert_eq!(super::toward_month_end(19_782, 2), 19_782);
        // 1969-12-01 (day -31) moves to 1969-12-28 (day -4).
        assert_eq!(super::toward_month_end(-31, 0), -4);
        assert_eq!(super::toward_month_end(i64::MAX, 1), i64::MAX);
    }
}
