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

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use braid_core::{Context, Event, OpId};
use futures::FutureExt as _;

use crate::error::{CollError, CollKind};

/// Run once when a collective completes (successfully or not).
pub type Callback = Box<dyn FnOnce() + Send + 'static>;

struct Inner<T> {
    done: Event,
    result: Mutex<Option<Result<T, CollError>>>,
}

/// A started collective.
pub struct Handle<T> {
    inner: Arc<Inner<T>>,
    rank: braid_core::Rank,
    coll: CollKind,
    op: OpId,
}

impl<T> std::fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("coll", &self.coll)
            .field("op", &self.op)
            .field("done", &self.inner.done.is_set())
            .finish()
    }
}

impl<T: Send + 'static> Handle<T> {
    /// Whether the collective has completed.
    pub fn is_done(&self) -> bool {
        self.inner.done.is_set()
    }

    /// The collective's OpId.
    pub fn op(&self) -> OpId {
        self.op
    }

    /// Blocks the calling thread until the collective completes and returns
    /// its result. Call it from a thread that is not one of the runtime's
    /// workers.
    pub fn wait(self) -> Result<T, CollError> {
        self.inner.done.wait_blocking();
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
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cb)) {
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
    let inner = Arc::new(Inner {
        done: Event::new(),
        result: Mutex::new(None),
    });
    let i2 = inner.clone();
    let ctx2 = ctx.clone();
    let rank = ctx.rank();
    // Boxed: a protocol's state machine is kilobytes, and the runtime
    // copies a task's whole future in and out of its cell (at spawn and
    // at completion); moving a pointer instead saves microseconds on small
    // collectives.
    let protocol = Box::pin(protocol);
    let span = tracing::debug_span!(
        "collective",
        rank = ctx.rank(),
        coll = coll.name(),
        op = op.0
    );
    ctx.progress().spawn(tracing::Instrument::instrument(
        async move {
            let t = Instant::now();
            // A panic (a user's reduction operator, say) still completes
            // the handle: its waiter gets an error instead of waiting
            // forever, and the job is aborted below.
            let r = match std::panic::AssertUnwindSafe(protocol).catch_unwind().await {
                Ok(r) => r,
                Err(p) => Err(CollError::Panicked {
                    rank,
                    coll,
                    op,
                    detail: braid_core::graph::panic_message(p),
                }),
            };
            ctx2.statistics().record_op(coll.name(), t.elapsed());
            if let Err(e) = &r {
                if e.aborts_job(ctx2.comm().failure().is_some()) {
                    ctx2.comm().abort(&e.to_string());
                }
            }
            *i2.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            run_callback(callback, &ctx2, coll, op, &i2);
            i2.done.set();
            if let Some(ev) = after {
                ev.set();
            }
        },
        span,
    ));
    Handle {
        inner,
        rank: ctx.rank(),
        coll,
        op,
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
        self.inner.done.set();
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
    let inner = Arc::new(Inner {
        done: Event::new(),
        result: Mutex::new(None),
    });
    (
        Handle {
            inner: inner.clone(),
            rank: ctx.rank(),
            coll,
            op,
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

/// The streaming form of a collective: starts its core with a callback that
/// sets an `Event`, awaits the event (as the context's progress engine
/// says to wait for an operation on `bytes` of this rank's data: see
/// `braid_core::Waiting`), returns the result.
pub(crate) async fn streaming<T: Send + 'static>(
    ctx: &Context,
    bytes: usize,
    start: impl FnOnce(Option<Callback>) -> Handle<T>,
) -> Result<T, CollError> {
    let ev = Event::new();
    let e2 = ev.clone();
    let h = start(Some(Box::new(move || e2.set())));
    ctx.progress().wait(&ev, bytes).await;
    h.take()
}
