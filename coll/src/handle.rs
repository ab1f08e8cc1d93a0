//! The non-streaming core's handle and the streaming wrapper.
//!
//! ```text
//!   start(ctx, args, callback) ──spawn on the progress engine──> protocol
//!        │                                                        │ done
//!        ▼                                                        ▼
//!   Handle<T> ◄── result stored ── callback() ── handle's event set
//!   wait(): blocks a thread on the event     streaming: awaits an Event
//!                                            that the callback sets
//! ```
//!
//! The streaming wrapper, on the engine's runtime, drives its core in its
//! own task instead of spawning it: the same future, polled by the one
//! task that waits for it. A spawned core costs a task (three allocations)
//! and, for a rank that waits, two wake-ups in a row (the core's, when its
//! messages come; then the waiter's, when the core completes); driven
//! inline, one. Measured (`braid-bench coll`, 4 in-process ranks on 2
//! workers, 8 B): Barrier, Broadcast and SendRecv 25-40% faster. If the
//! waiter is dropped before the core completes, the core is handed to the
//! engine, so a collective that peers are in still completes here.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Instant;

use braid_core::{CommError, Context, Event, OpId, Waiting};

use crate::error::{CollError, CollKind};

/// Run once when a collective completes (successfully or not).
pub type Callback = Box<dyn FnOnce() + Send + 'static>;

struct Inner<T> {
    done: AtomicBool,
    /// Made by the first waiter that needs to sleep: a core driven by its
    /// own waiter never needs one (one allocation and a notify less).
    event: OnceLock<Event>,
    result: Mutex<Option<Result<T, CollError>>>,
}

impl<T> Inner<T> {
    fn new() -> Self {
        Inner {
            done: AtomicBool::new(false),
            event: OnceLock::new(),
            result: Mutex::new(None),
        }
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Marks the collective complete (its result stored) and wakes any
    /// waiter.
    fn set_done(&self) {
        // The fences (here and in `event`) order the flag and the event's
        // cell: either this sees the waiter's event, or the waiter sees
        // the flag and sets its event itself.
        self.done.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if let Some(ev) = self.event.get() {
            ev.set();
        }
    }

    /// The event that completion sets, made on first use.
    fn event(&self) -> &Event {
        let ev = self.event.get_or_init(Event::new);
        fence(Ordering::SeqCst);
        if self.done.load(Ordering::SeqCst) {
            ev.set();
        }
        ev
    }
}

/// A started collective.
pub struct Handle<T> {
    inner: Arc<Inner<T>>,
    rank: braid_core::Rank,
    coll: CollKind,
    op: OpId,
    /// The runtime that drives the core (its rank's progress engine's).
    driver: tokio::runtime::Id,
}

impl<T> std::fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("coll", &self.coll)
            .field("op", &self.op)
            .field("done", &self.inner.is_done())
            .finish()
    }
}

impl<T: Send + 'static> Handle<T> {
    /// Whether the collective has completed.
    pub fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    /// The collective's OpId.
    pub fn op(&self) -> OpId {
        self.op
    }

    /// Blocks the calling thread until the collective completes and returns
    /// its result. From a job's own task (a worker of its rank's runtime)
    /// the worker's other tasks move to another thread while it waits; in
    /// the `block_on` of the current-thread runtime that drives the
    /// collective it fails at once, since the wait could never end there.
    /// Never call it from a task spawned on that current-thread runtime
    /// (it would hold the one thread the collective needs): await the
    /// streaming form there. See [`braid_core::Event::wait_blocking_beside`].
    pub fn wait(self) -> Result<T, CollError> {
        if IN_CORE.with(|c| c.get()) {
            // A completion callback (or a core) runs on the engine's own
            // task: blocking there holds a thread the collectives need
            // (the only one with a current-thread driver, or a rank's one
            // worker), and the wait never ends.
            return Err(CollError::InvalidArgument {
                rank: self.rank,
                coll: self.coll,
                op: self.op,
                detail: "Handle::wait inside a collective's completion callback would hold the thread that drives collectives (and never end): wait elsewhere, or await the streaming form".into(),
            });
        }
        if let Err(e) = self.inner.event().wait_blocking_beside(self.driver) {
            return Err(CollError::InvalidArgument {
                rank: self.rank,
                coll: self.coll,
                op: self.op,
                detail: format!("Handle::wait: {e}"),
            });
        }
        self.take()
    }

    /// The result once complete (after the callback ran or `is_done`).
    pub fn take(self) -> Result<T, CollError> {
        self.inner
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| {
                Err(CollError::InvalidArgument {
                    rank: self.rank,
                    coll: self.coll,
                    op: self.op,
                    detail: "result taken before completion".into(),
                })
            })
    }
}

/// Runs a completed collective's callback. A callback that panics (a
/// user's) fails the handle with [`CollError::Panicked`] and aborts the job,
/// and the caller still sets the handle's event: nothing waits forever.
fn run_callback<T>(
    callback: Option<Callback>,
    ctx: &Context,
    coll: CollKind,
    op: OpId,
    inner: &Inner<T>,
) {
    let Some(cb) = callback else {
        return;
    };
    let was = IN_CORE.with(|c| c.replace(true));
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cb));
    IN_CORE.with(|c| c.set(was));
    if let Err(p) = ran {
        let e = CollError::Panicked {
            rank: ctx.rank(),
            coll,
            op,
            detail: format!(
                "in its completion callback: {}",
                braid_core::graph::panic_message(p)
            ),
        };
        ctx.comm().abort(&e.to_string());
        *inner.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(Err(e));
    }
}

/// Starts a collective's protocol on the context's progress engine.
pub(crate) fn start<T, F>(
    ctx: &Context,
    coll: CollKind,
    op: OpId,
    callback: Option<Callback>,
    protocol: F,
) -> Handle<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, CollError>> + Send + 'static,
{
    start_then(ctx, coll, op, callback, None, protocol)
}

/// [`start`], also setting `after` once the handle is complete: after the
/// result is stored and the callback has run (or failed the handle, if it
/// panicked), so a waiter on `after` sees the final result.
pub(crate) fn start_then<T, F>(
    ctx: &Context,
    coll: CollKind,
    op: OpId,
    callback: Option<Callback>,
    after: Option<Event>,
    protocol: F,
) -> Handle<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, CollError>> + Send + 'static,
{
    let inner = Arc::new(Inner::new());
    let span = tracing::debug_span!(
        "collective",
        rank = ctx.rank(),
        coll = coll.name(),
        op = op.0
    );
    // One allocation for the whole core, the protocol's state machine
    // (kilobytes) inside it; it is moved into the box once and never
    // again.
    launch(
        ctx,
        Box::pin(CoreRun {
            protocol,
            inner: inner.clone(),
            ctx: ctx.clone(),
            coll,
            op,
            callback,
            after,
            started: None,
            finished: false,
            span,
            running: Some(ctx.core_started()),
        }),
    );
    Handle {
        inner,
        rank: ctx.rank(),
        coll,
        op,
        driver: ctx.progress().runtime_id(),
    }
}

/// A core's whole run: its protocol, then storing the result, the
/// callback, the handle's completion and `after`. A panic in the protocol
/// (a user's reduction operator, say) still completes the handle: its
/// waiter gets an error instead of waiting forever, and the job is
/// aborted. A core dropped before it completes (its runtime shut down
/// under it) fails the handle the same way (see its `PinnedDrop`).
#[pin_project::pin_project(PinnedDrop)]
struct CoreRun<T, F> {
    #[pin]
    protocol: F,
    inner: Arc<Inner<T>>,
    ctx: Context,
    coll: CollKind,
    op: OpId,
    callback: Option<Callback>,
    after: Option<Event>,
    /// When the protocol was first polled.
    started: Option<Instant>,
    /// Complete: never poll the protocol again.
    finished: bool,
    span: tracing::Span,
    /// Counts this core as running on its rank until it completes (or is
    /// dropped): the rank's job waits for it before shutting down.
    running: Option<braid_core::CoreGuard>,
}

impl<T, F> Future for CoreRun<T, F>
where
    F: Future<Output = Result<T, CollError>>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let this = self.project();
        if *this.finished {
            return Poll::Ready(());
        }
        let _enter = this.span.enter();
        let started = *this.started.get_or_insert_with(Instant::now);
        let protocol = this.protocol;
        let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| protocol.poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(r)) => r,
            Err(p) => Err(CollError::Panicked {
                rank: this.ctx.rank(),
                coll: *this.coll,
                op: *this.op,
                detail: braid_core::graph::panic_message(p),
            }),
        };
        *this.finished = true;
        let (ctx, coll, op) = (&*this.ctx, *this.coll, *this.op);
        ctx.statistics().record_op(coll.name(), started.elapsed());
        if let Err(e) = &r {
            if e.aborts_job(ctx.comm().failure().is_some()) {
                ctx.comm().abort(&e.to_string());
            }
        }
        *this.inner.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        run_callback(this.callback.take(), ctx, coll, op, this.inner);
        this.inner.set_done();
        if let Some(ev) = this.after.take() {
            ev.set();
        }
        this.running.take();
        Poll::Ready(())
    }
}

/// A core dropped unfinished (its runtime shut down, or was gone when it
/// started): the handle fails with the communicator's failure, or as shut
/// down, its callback runs and `after` is set, so that a waiter on another
/// thread gets an error instead of waiting for ever (it waited, and then
/// read "result taken before completion"). Nothing is told to the peers
/// here: a runtime is dropped under a core after a failure (the job's
/// abort already went out) or by a caller ending this rank, whose
/// communicator's own end tells them.
#[pin_project::pinned_drop]
impl<T, F> PinnedDrop for CoreRun<T, F> {
    fn drop(self: Pin<&mut Self>) {
        let this = self.project();
        if *this.finished {
            return;
        }
        *this.finished = true;
        let (ctx, coll, op) = (&*this.ctx, *this.coll, *this.op);
        let source = ctx
            .comm()
            .failure()
            .unwrap_or(CommError::Shutdown { rank: ctx.rank() });
        let e = CollError::Comm {
            rank: ctx.rank(),
            coll,
            op,
            source,
        };
        *this.inner.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(Err(e));
        run_callback(this.callback.take(), ctx, coll, op, this.inner);
        this.inner.set_done();
        if let Some(ev) = this.after.take() {
            ev.set();
        }
        this.running.take();
    }
}

/// A started core, type-erased.
pub(crate) type Core = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where the next core started on this thread goes.
enum Claim {
    /// To the progress engine.
    Spawn,
    /// To the streaming wrapper that armed the claim (it drives it).
    Wanted,
    /// Taken for that wrapper.
    Taken(Core),
}

thread_local! {
    static CLAIM: RefCell<Claim> = const { RefCell::new(Claim::Spawn) };
    /// Set while a completion callback runs (where [`Handle::wait`] is
    /// refused: see there).
    static IN_CORE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Hands a started core to the streaming wrapper that claimed it, or else
/// to the progress engine.
fn launch(ctx: &Context, core: Core) {
    let spawn = CLAIM.with(|c| {
        let mut c = c.borrow_mut();
        if let Claim::Wanted = *c {
            *c = Claim::Taken(core);
            None
        } else {
            Some(core)
        }
    });
    if let Some(core) = spawn {
        ctx.progress().spawn(core);
    }
}

/// Calls `start` with a claim armed on this thread: returns its handle and
/// the first core it started (none if it started none).
pub(crate) fn claim<T>(start: impl FnOnce() -> Handle<T>) -> (Handle<T>, Option<Core>) {
    /// Disarms the claim however `start` returns (a panic included).
    struct Disarm;
    impl Drop for Disarm {
        fn drop(&mut self) {
            CLAIM.with(|c| *c.borrow_mut() = Claim::Spawn);
        }
    }
    CLAIM.with(|c| *c.borrow_mut() = Claim::Wanted);
    let disarm = Disarm;
    let h = start();
    let got = CLAIM.with(|c| std::mem::replace(&mut *c.borrow_mut(), Claim::Spawn));
    drop(disarm);
    match got {
        Claim::Taken(core) => (h, Some(core)),
        Claim::Spawn | Claim::Wanted => (h, None),
    }
}

/// A core driven by the task that waits for it. Dropped unfinished (its
/// waiter was cancelled), it goes to the progress engine and completes
/// there: peers may be inside the same collective.
pub(crate) struct Driven {
    core: Option<Core>,
    progress: braid_core::ProgressEngine,
}

impl Drop for Driven {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            self.progress.spawn(core);
        }
    }
}

impl Driven {
    /// `core`, to be driven by the task that waits for it (or, dropped
    /// unfinished, by the engine).
    pub(crate) fn new(core: Core, progress: braid_core::ProgressEngine) -> Self {
        Driven {
            core: Some(core),
            progress,
        }
    }

    /// Polls the core once, with a waker that does nothing (whatever it
    /// waits for then keeps the waker of a later poll: `run`'s, or the
    /// engine's if this is dropped): to let it start now a step that must
    /// not wait for `run`. Whether it completed (then drop this).
    pub(crate) fn poll_once(&mut self) -> bool {
        let Some(core) = self.core.as_mut() else {
            return true;
        };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if core.as_mut().poll(&mut cx).is_ready() {
            self.core = None;
            return true;
        }
        false
    }

    /// Polls the core to completion; while it waits, polls again after
    /// letting other tasks run (see `Waiting::pass`) as `waiting` says,
    /// then sleeps until what the core awaits wakes it.
    pub(crate) async fn run(mut self, waiting: Waiting) {
        let t = Instant::now();
        let Some(core) = self.core.as_mut() else {
            return;
        };
        if let Some(limit) = waiting.limit() {
            let mut n = 0;
            loop {
                if futures::poll!(core.as_mut()).is_ready() {
                    self.core = None;
                    return;
                }
                if t.elapsed() >= limit {
                    break;
                }
                waiting.pass(n).await;
                n = n.wrapping_add(1);
            }
        }
        core.as_mut().await;
        self.core = None;
    }
}

#[cfg(feature = "cuda")]
/// Completes a handle made by [`manual`] from wherever the work finishes
/// (a callback on another thread, say), without a task of its own.
pub(crate) struct Finisher<T> {
    inner: Arc<Inner<T>>,
    ctx: Context,
    coll: CollKind,
    callback: Option<Callback>,
    started: Instant,
    /// Set by `finish`; a finisher dropped without it fails its handle.
    finished: bool,
    op: OpId,
}

#[cfg(feature = "cuda")]
impl<T> Finisher<T> {
    /// Records the statistics, aborts the job on an error that requires it,
    /// stores the result, runs the callback and sets the handle's event.
    pub(crate) fn finish(mut self, r: Result<T, CollError>) {
        self.finished = true;
        self.complete(r);
    }

    fn complete(&mut self, r: Result<T, CollError>) {
        self.ctx
            .statistics()
            .record_op(self.coll.name(), self.started.elapsed());
        if let Err(e) = &r {
            if e.aborts_job(self.ctx.comm().failure().is_some()) {
                self.ctx.comm().abort(&e.to_string());
            }
        }
        *self.inner.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        run_callback(
            self.callback.take(),
            &self.ctx,
            self.coll,
            self.op,
            &self.inner,
        );
        self.inner.set_done();
    }
}

#[cfg(feature = "cuda")]
impl<T> Drop for Finisher<T> {
    /// Dropped without finishing (the work that owned it panicked or was
    /// lost): the handle fails instead of waiting forever.
    fn drop(&mut self) {
        if !self.finished {
            self.finished = true;
            let e = CollError::Device {
                rank: self.ctx.rank(),
                coll: self.coll,
                op: self.op,
                detail: "the operation was dropped before it completed".into(),
            };
            self.complete(Err(e));
        }
    }
}

#[cfg(feature = "cuda")]
/// A handle whose completion is driven by hand through its `Finisher`.
pub(crate) fn manual<T>(
    ctx: &Context,
    coll: CollKind,
    op: OpId,
    callback: Option<Callback>,
) -> (Handle<T>, Finisher<T>) {
    let inner = Arc::new(Inner::new());
    (
        Handle {
            inner: inner.clone(),
            rank: ctx.rank(),
            coll,
            op,
            driver: ctx.progress().runtime_id(),
        },
        Finisher {
            inner,
            ctx: ctx.clone(),
            coll,
            callback,
            started: Instant::now(),
            finished: false,
            op,
        },
    )
}

#[cfg(feature = "cuda")]
/// Like [`streaming`], but the awaiting task keeps polling (yielding to
/// other tasks) for up to `spin` before it sleeps on the event: a wake-up
/// from another thread costs a parked worker several microseconds, which
/// matters for collectives that complete in tens of microseconds (device
/// collectives).
pub(crate) async fn streaming_spin<T: Send + 'static>(
    spin: std::time::Duration,
    start: impl FnOnce(Option<Callback>) -> Handle<T>,
) -> Result<T, CollError> {
    let ev = Event::new();
    let e2 = ev.clone();
    let h = start(Some(Box::new(move || e2.set())));
    let t = Instant::now();
    // Yielding polls, then sleep on the event. (No pure spin: it would
    // hold this worker, and a task spawned from it, such as the call's own
    // check, waits in the worker's LIFO slot until the spin ends.)
    while !ev.is_set() {
        if t.elapsed() > spin {
            ev.wait().await;
            break;
        }
        tokio::task::yield_now().await;
    }
    h.take()
}

/// The streaming form of a collective: starts its core and awaits the event
/// that its completion sets (as the context's progress engine says to wait
/// for an operation on `bytes` of this rank's data: see
/// `braid_core::Waiting`), returns the result. On the engine's runtime the
/// core is driven by this task (see the module doc).
pub(crate) async fn streaming<T: Send + 'static>(
    ctx: &Context,
    bytes: usize,
    start: impl FnOnce(Option<Callback>) -> Handle<T>,
) -> Result<T, CollError> {
    let progress = ctx.progress();
    let (h, core) = if progress.is_current() {
        claim(|| start(None))
    } else {
        (start(None), None)
    };
    if let Some(core) = core {
        Driven::new(core, progress.clone())
            .run(progress.waiting(bytes))
            .await;
    }
    // Set already when the core was driven here (unless `start` started
    // another core after it).
    if !h.inner.is_done() {
        progress.wait(h.inner.event(), bytes).await;
    }
    h.take()
}

/// Local work, in bytes, from which [`spread`] lets another worker take
/// the task first: a copy of 256 KiB takes ~15 us on the 2-core VM, and a
/// yield costs up to a few us (3 us measured where it was not needed);
/// below that the yield would cost more than it can save.
pub(crate) const SPREAD_MIN: usize = 256 << 10;

/// Called by a rank just before `bytes` of local work (a copy or a
/// reduction) that follows a meeting: on a multi-thread runtime, yields
/// once, so that an idle worker can take this task.
///
/// Why: the rank that completes a meeting wakes the others from its own
/// worker, and tokio puts a task woken that way in that worker's LIFO
/// slot, which other workers cannot steal and which is not announced to
/// them (tokio-rs/tokio#4941). Without the yield the ranks' copies then
/// run one after the other on one worker while the others sleep: two
/// in-process ranks on 2 workers used 1.0 CPU for a 1 MiB AllToAll
/// (175 us a call), and 100 us with the yield. A task that wakes itself
/// goes to the back of its worker's queue, where it can be stolen, and
/// tokio wakes a sleeping worker for it.
pub(crate) async fn spread(bytes: usize) {
    let multi = || {
        tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
    };
    if bytes >= SPREAD_MIN && multi() {
        YieldOnce(false).await;
    }
}

/// What a core's last step does with the data it received: copies it
/// into a result of its own (so it first lets another worker take the
/// task: [`spread`]), or keeps it as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResultStep {
    Copies,
    Keeps,
}

/// Pending once (after waking its own task), then ready.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// How this rank left a collective of inserts and a finish (AllGather,
/// Shuffle) before its finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Extracted first: nothing could end the wait.
    Extracted,
    /// Waited on first (`Shuffle::wait`): the same.
    Waited,
    /// Dropped first.
    Dropped,
}

/// How long a part dropped unfinished waits for the job to fail some other
/// way before it fails the job itself (see [`left_unfinished`]).
const DROPPED_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// The error of a part this rank left unfinished: its peers would wait
/// for the rest of it for ever, so the core fails (and with it the job).
/// A part is most often dropped on the way out of an error of this rank's
/// own (a `?` past it), whose abort should reach the other ranks rather
/// than this consequence of it: a dropped part first gives the job up to
/// `DROPPED_GRACE` to fail, and then reports that failure (which aborts
/// nothing more).
pub(crate) async fn left_unfinished(
    comm: &dyn braid_core::Communicator,
    site: crate::error::Site,
    how: Left,
) -> CollError {
    if how == Left::Dropped {
        let until = Instant::now() + DROPPED_GRACE;
        loop {
            if let Some(e) = comm.failure() {
                return site.comm(e);
            }
            if Instant::now() >= until {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    site.abandoned(match how {
        Left::Extracted => "extracted",
        Left::Waited => "waited on",
        Left::Dropped => "dropped",
    })
}

/// Runs `work` (receiving the peers' streams) until it ends, or until this
/// rank's part ends (`local_done`) and `left` says it was left unfinished:
/// then that error ([`left_unfinished`]), without waiting for peers that
/// may never send the rest.
pub(crate) async fn until_abandoned<T>(
    work: impl Future<Output = Result<T, CollError>>,
    local_done: &Event,
    comm: &dyn braid_core::Communicator,
    site: crate::error::Site,
    left: impl FnOnce() -> Option<Left>,
) -> Result<T, CollError> {
    let mut work = std::pin::pin!(work);
    let done = std::pin::pin!(local_done.wait());
    match futures::future::select(work.as_mut(), done).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right(((), _)) => {
            if let Some(how) = left() {
                return Err(left_unfinished(comm, site, how).await);
            }
            work.await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls of `spread(bytes)` until it completes, on the current runtime.
    async fn polls_of_spread(bytes: usize) -> u32 {
        let mut fut = std::pin::pin!(spread(bytes));
        let mut polls = 0;
        std::future::poll_fn(|cx| {
            polls += 1;
            fut.as_mut().poll(cx)
        })
        .await;
        polls
    }

    #[test]
    fn spread_yields_once_for_large_work_on_a_multi_thread_runtime_only() {
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        assert_eq!(multi.block_on(polls_of_spread(SPREAD_MIN)), 2);
        assert_eq!(multi.block_on(polls_of_spread(64 << 20)), 2);
        assert_eq!(multi.block_on(polls_of_spread(SPREAD_MIN - 1)), 1);
        assert_eq!(multi.block_on(polls_of_spread(0)), 1);
        let single = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        assert_eq!(single.block_on(polls_of_spread(64 << 20)), 1);
    }

    /// An in-process world of `n` ranks on a runtime of one worker (what a
    /// rank of `run_world` gets on 2 cores with 2 ranks).
    fn one_worker_world(n: u32) -> (tokio::runtime::Runtime, Vec<Context>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let spec = braid_core::WorldSpec::Local { nranks: n };
        let ctxs = rt
            .block_on(braid_core::world::contexts(
                &spec,
                braid_core::MemoryLimits::UNLIMITED,
            ))
            .unwrap();
        (rt, ctxs)
    }

    /// A core whose runtime is dropped before it completes (here a Barrier
    /// that rank 1 never joins) fails its handle: a waiter on another
    /// thread gets an error naming the collective, and the callback runs
    /// once (the waiter waited for ever, the callback never ran).
    #[test]
    fn a_core_dropped_with_its_runtime_fails_its_handle() {
        use std::sync::atomic::AtomicUsize;
        let (rt, ctxs) = one_worker_world(2);
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        let h = crate::start_barrier(
            &ctxs[0],
            Some(Box::new(move || {
                c2.fetch_add(1, Ordering::SeqCst);
            })),
        );
        drop(rt);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(h.wait());
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the handle of a dropped core still waits");
        let e = r.unwrap_err().to_string();
        assert!(e.contains("barrier") && e.contains("shut down"), "{e}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop(ctxs);
    }

    /// A blocking wait inside a completion callback fails at once instead
    /// of holding the thread the collectives need (with a rank's one
    /// worker, the two waited for each other for ever).
    #[test]
    fn a_wait_inside_a_callback_is_refused() {
        let (rt, ctxs) = one_worker_world(1);
        let ctx = ctxs[0].clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = crate::start_barrier(
            &ctxs[0],
            Some(Box::new(move || {
                let inner = crate::start_barrier(&ctx, None);
                let _ = tx.send(inner.wait().map_err(|e| e.to_string()));
            })),
        );
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the wait inside the callback still blocks");
        let e = got.unwrap_err();
        assert!(e.contains("completion callback"), "{e}");
        h.wait().unwrap();
        drop(ctxs);
        drop(rt);
    }
}
