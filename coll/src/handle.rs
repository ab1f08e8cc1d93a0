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
    let inner = Arc::new(Inner {
        done: Event::new(),
        result: Mutex::new(None),
    });
    let i2 = inner.clone();
    let ctx2 = ctx.clone();
    let span = tracing::debug_span!(
        "collective",
        rank = ctx.rank(),
        coll = coll.name(),
        op = op.0
    );
    ctx.progress().spawn(tracing::Instrument::instrument(
        async move {
            let t = Instant::now();
            let r = protocol.await;
            ctx2.statistics().record_op(coll.name(), t.elapsed());
            if let Err(e) = &r {
                if e.aborts_job() {
                    ctx2.comm().abort(&e.to_string());
                }
            }
            *i2.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            if let Some(cb) = callback {
                cb();
            }
            i2.done.set();
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

/// The streaming form of a collective: starts its core with a callback that
/// sets an `Event`, awaits the event, returns the result.
pub(crate) async fn streaming<T: Send + 'static>(
    start: impl FnOnce(Option<Callback>) -> Handle<T>,
) -> Result<T, CollError> {
    let ev = Event::new();
    let e2 = ev.clone();
    let h = start(Some(Box::new(move || e2.set())));
    ev.wait().await;
    h.take()
}
