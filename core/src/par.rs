//! Helper threads for large CPU work inside a collective (a result's copy,
//! a reduction): [`for_each_share`] runs `f(0..shares)` with the calling
//! thread taking share 0 and the process's helpers the others, and
//! returns once every share has run.
//!
//! ```text
//!   caller:   push shares 1..k ──► run share 0 ──► take back shares still
//!             queued and run them ──► wait for the latch ──► return
//!   helpers:  (asleep) ◄─ woken ─ pop a share, run it, count the latch down
//! ```
//!
//! Why a pool: starting a scoped thread per share cost 50-90 us on a
//! 16-core VM (measured: a 1 MiB AllToAll's copy split in two took 163 us
//! against 72 unsplit), as much as the copy it was to halve. Helpers that
//! ran out of work spin for `SPIN` (100 us) before they sleep, and so does a
//! caller waiting for its shares, since a sleeping thread's wake-up costs
//! tens of us on a VM too. The helpers are started on first use,
//! one fewer than the host's cores (the caller is the last), and shared by
//! every rank of the process; callers size their shares to their own
//! share of the cores (`cores_per_rank`), so ranks that split at once do
//! not queue behind each other for long.
//!
//! [`spawn`] hands one owned piece of work to a helper and returns at
//! once; the caller goes on with work of its own (a collective's receives,
//! whose transport progresses in the caller's thread) and joins it later:
//!
//! ```text
//!   caller:   push job ──► own work (receives) ──► join: take the job back
//!             if still queued and run it, else wait for the latch
//!   helper:   pop the job, run it, count the latch down
//! ```
//!
//! Invariant the borrowed `f` rests on: `for_each_share` does not return,
//! nor unwind, before every share it queued has run and counted the latch
//! down (a panic in a share is caught and raised again in the caller after
//! the wait).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// A share's work, with its lifetime erased (see the module invariant).
type Work = &'static (dyn Fn(usize) + Sync);

/// What a queued job runs.
enum Task {
    /// Share `.1` of a [`for_each_share`] call's borrowed work.
    Share(Work, usize),
    /// A [`spawn`]ed closure, which owns what it uses.
    Owned(Box<dyn FnOnce() + Send>),
}

/// One queued piece of work.
struct Job {
    task: Task,
    latch: Arc<Latch>,
}

impl Job {
    fn run(self) {
        let r = catch_unwind(AssertUnwindSafe(|| match self.task {
            Task::Share(work, share) => work(share),
            Task::Owned(f) => f(),
        }));
        self.latch.count_down(r.err());
    }
}

/// Counts a call's queued shares down to zero; keeps the first panic.
struct Latch {
    state: Mutex<(usize, Option<Box<dyn std::any::Any + Send>>)>,
    zero: Condvar,
    /// The count, also readable without the lock (for the waiter's spin).
    left: AtomicUsize,
}

impl Latch {
    fn count_down(&self, panic: Option<Box<dyn std::any::Any + Send>>) {
        let mut s = lock(&self.state);
        s.0 -= 1;
        self.left.store(s.0, Ordering::Release);
        if s.1.is_none() {
            s.1 = panic;
        }
        if s.0 == 0 {
            self.zero.notify_all();
        }
    }

    /// Waits for zero; the first panic of a share, if any.
    fn wait(&self) -> Option<Box<dyn std::any::Any + Send>> {
        spin_until(|| self.left.load(Ordering::Acquire) == 0);
        let mut s = lock(&self.state);
        while s.0 > 0 {
            s = self.zero.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.1.take()
    }
}

/// The process's helpers and their queue.
struct Pool {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
    /// Jobs in `queue`, also readable without the lock (for the helpers'
    /// spin).
    queued: AtomicUsize,
    /// Helpers that started.
    helpers: AtomicUsize,
}

/// How long a helper that ran out of work, or a caller whose shares are
/// still running, spins before it sleeps. Waking a sleeping thread costs
/// tens of us on a VM (the idle vCPU is halted): more than the wait it
/// would end, for collectives called back to back.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// Spins until `done` or [`SPIN`] has passed.
fn spin_until(done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        if start.elapsed() >= SPIN {
            return;
        }
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        // Leaked on purpose: the helpers live as long as the process.
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            queued: AtomicUsize::new(0),
            helpers: AtomicUsize::new(0),
        }));
        for i in 0..crate::context::host_cores().saturating_sub(1) {
            let spawned = std::thread::Builder::new()
                .name(format!("braid-helper-{i}"))
                .spawn(move || helper(pool));
            if spawned.is_err() {
                break;
            }
            pool.helpers.fetch_add(1, Ordering::Relaxed);
        }
        pool
    })
}

/// A helper's life: pop a share, run it, sleep while there is none.
fn helper(pool: &'static Pool) {
    loop {
        spin_until(|| pool.queued.load(Ordering::Relaxed) > 0);
        let job = {
            let mut q = lock(&pool.queue);
            loop {
                match pool.pop(&mut q, |_| true) {
                    Some(j) => break j,
                    None => q = pool.ready.wait(q).unwrap_or_else(|p| p.into_inner()),
                }
            }
        };
        job.run();
    }
}

impl Pool {
    /// The first queued job that `mine` accepts, taken off the queue.
    fn pop(&self, q: &mut VecDeque<Job>, mine: impl Fn(&Job) -> bool) -> Option<Job> {
        let at = q.iter().position(mine)?;
        let job = q.remove(at)?;
        self.queued.store(q.len(), Ordering::Relaxed);
        Some(job)
    }
}

/// Runs `f(k)` for every `k` in `0..shares`, share 0 on the calling thread
/// and the others on the process's helper threads (or on the calling
/// thread, where no helper takes them first); returns once all have run.
/// A panic in any share is raised again here, after every share ended.
///
/// Blocks the calling thread: meant for work of at least tens of
/// microseconds a share (copies and reductions of hundreds of KiB), where
/// handing a share over is small beside it.
pub fn for_each_share(shares: usize, f: &(dyn Fn(usize) + Sync)) {
    if shares <= 1 {
        if shares == 1 {
            f(0);
        }
        return;
    }
    let pool = pool();
    let helpers = pool.helpers.load(Ordering::Relaxed);
    let latch = Arc::new(Latch {
        state: Mutex::new((shares - 1, None)),
        zero: Condvar::new(),
        left: AtomicUsize::new(shares - 1),
    });
    // SAFETY: the module invariant: every job made here has run (and so
    // stopped using `work`) before this function returns or unwinds: the
    // caller's own share is caught, jobs taken back run here, and the
    // latch is waited for before anything is raised again.
    let work: Work = unsafe {
        std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
    };
    let mut q = lock(&pool.queue);
    for share in 1..shares {
        q.push_back(Job {
            task: Task::Share(work, share),
            latch: latch.clone(),
        });
    }
    pool.queued.store(q.len(), Ordering::Relaxed);
    drop(q);
    for _ in 1..shares.min(helpers + 1) {
        pool.ready.notify_one();
    }
    let own = catch_unwind(AssertUnwindSafe(|| f(0)));
    // Shares no helper has taken yet (all of them where the process has
    // no helpers) run here rather than wait.
    while let Some(j) = pool.pop(&mut lock(&pool.queue), |j| Arc::ptr_eq(&j.latch, &latch)) {
        j.run();
    }
    let theirs = latch.wait();
    if let Err(p) = own {
        resume_unwind(p);
    }
    if let Some(p) = theirs {
        resume_unwind(p);
    }
}

/// Work handed to a helper by [`spawn`]; [`Spawned::join`] gives its
/// result. Dropped without a join, the work still runs (it owns what it
/// uses) and its result is dropped.
pub struct Spawned<R> {
    latch: Arc<Latch>,
    out: Arc<Mutex<Option<R>>>,
}

/// Runs `f` on a helper thread while the caller goes on; where the process
/// has no helpers (one core), `f` runs here, now. For work of tens of
/// microseconds or more that the caller can overlap with its own (a
/// collective's own part copied while its thread receives the others').
pub fn spawn<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Spawned<R> {
    let out = Arc::new(Mutex::new(None));
    let latch = Arc::new(Latch {
        state: Mutex::new((1, None)),
        zero: Condvar::new(),
        left: AtomicUsize::new(1),
    });
    let slot = out.clone();
    let job = Job {
        task: Task::Owned(Box::new(move || *lock(&slot) = Some(f()))),
        latch: latch.clone(),
    };
    let pool = pool();
    if pool.helpers.load(Ordering::Relaxed) == 0 {
        job.run();
    } else {
        let mut q = lock(&pool.queue);
        q.push_back(job);
        pool.queued.store(q.len(), Ordering::Relaxed);
        drop(q);
        pool.ready.notify_one();
    }
    Spawned { latch, out }
}

impl<R> Spawned<R> {
    /// Whether the work has run (a join then returns without waiting).
    pub fn is_done(&self) -> bool {
        self.latch.left.load(Ordering::Acquire) == 0
    }

    /// The work's result, once it ran: taken back and run here if no
    /// helper has started it, else waited for (spinning first, as
    /// [`for_each_share`] waits). A panic in the work is raised again here.
    pub fn join(self) -> R {
        let pool = pool();
        while let Some(j) = pool.pop(&mut lock(&pool.queue), |j| {
            Arc::ptr_eq(&j.latch, &self.latch)
        }) {
            j.run();
        }
        if let Some(p) = self.latch.wait() {
            resume_unwind(p);
        }
        match lock(&self.out).take() {
            Some(r) => r,
            // (The work ran to its end without a panic: it stored its
            // result before counting the latch down.)
            None => unreachable!("a spawned job counted down without a result or a panic"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_share_runs_once_before_the_call_returns() {
        for shares in [0usize, 1, 2, 3, 7, 40] {
            let seen: Vec<AtomicUsize> = (0..shares).map(|_| AtomicUsize::new(0)).collect();
            for_each_share(shares, &|k| {
                std::thread::sleep(std::time::Duration::from_micros(200));
                seen[k].fetch_add(1, Ordering::SeqCst);
            });
            assert!(
                seen.iter().all(|c| c.load(Ordering::SeqCst) == 1),
                "{shares}"
            );
        }
    }

    #[test]
    fn calls_from_several_threads_at_once() {
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for round in 0..50usize {
                        let mut out = vec![0usize; 6];
                        let cells: Vec<Mutex<&mut usize>> =
                            out.iter_mut().map(Mutex::new).collect();
                        for_each_share(6, &|k| **lock(&cells[k]) = t * 1000 + round * 10 + k);
                        drop(cells);
                        let want: Vec<usize> = (0..6).map(|k| t * 1000 + round * 10 + k).collect();
                        assert_eq!(out, want);
                    }
                });
            }
        });
    }

    #[test]
    fn spawned_work_runs_once_and_its_result_comes_back() {
        for k in 0..200u64 {
            let v: Vec<u64> = (0..1000).map(|i| i * k).collect();
            let job = spawn(move || v.iter().sum::<u64>());
            if k % 3 == 0 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            assert_eq!(job.join(), 999 * 1000 / 2 * k);
        }
        // Many at once, joined in reverse order.
        let jobs: Vec<_> = (0..64u64).map(|k| spawn(move || k * k)).collect();
        for (k, j) in jobs.into_iter().enumerate().rev() {
            assert_eq!(j.join(), (k * k) as u64);
        }
        // A panic comes back at the join, and the helpers survive it.
        let bad = spawn(|| -> u32 { panic!("spawned work fails") });
        assert!(catch_unwind(AssertUnwindSafe(|| bad.join())).is_err());
        let ok = spawn(|| 7u32);
        let start = std::time::Instant::now();
        while !ok.is_done() && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::yield_now();
        }
        assert_eq!(ok.join(), 7);
    }

    #[test]
    fn a_panicking_share_is_raised_after_all_shares_ran() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            for_each_share(5, &|k| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                ran.fetch_add(1, Ordering::SeqCst);
                if k == 3 {
                    panic!("share 3 fails");
                }
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 5);
        // The helpers survive it.
        let again = AtomicUsize::new(0);
        for_each_share(4, &|_| {
            again.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(again.load(Ordering::SeqCst), 4);
    }
}
