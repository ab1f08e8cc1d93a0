//! `Event`: a flag that is set once and can be awaited by tasks or waited
//! on by threads. It is how a collective's completion callback wakes its
//! streaming wrapper (async) or a blocking `wait()` caller (thread).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Inner {
    set: AtomicBool,
    notify: Notify,
    /// Threads inside `wait_blocking*`. `set` only touches the condition
    /// variable when this is not zero: a notify always costs a futex system
    /// call, and most events (every streaming collective's) never have a
    /// blocked thread.
    blocked: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// A set-once event. Cloning gives another handle to the same event.
#[derive(Debug, Clone, Default)]
pub struct Event {
    inner: Arc<Inner>,
}

impl Event {
    /// A new, unset event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the event and wakes every waiter. Setting twice is a no-op.
    pub fn set(&self) {
        // SeqCst on `set` and `blocked` (here and in `wait_blocking`):
        // either this load sees the blocked thread, or that thread's check
        // of the flag sees it set.
        if !self.inner.set.swap(true, Ordering::SeqCst) {
            self.inner.notify.notify_waiters();
            if self.inner.blocked.load(Ordering::SeqCst) != 0 {
                // Taking the lock orders this notify after a blocked
                // waiter's check of the flag, so no wake-up is lost.
                let _g = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
                self.inner.cv.notify_all();
            }
        }
    }

    /// Whether the event is set.
    pub fn is_set(&self) -> bool {
        self.inner.set.load(Ordering::Acquire)
    }

    /// Waits (asynchronously) until the event is set.
    pub async fn wait(&self) {
        if self.is_set() {
            return;
        }
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }

    /// Blocks the calling thread until the event is set. Do not call this
    /// from a task of the runtime that must set the event.
    pub fn wait_blocking(&self) {
        let _b = Blocked::enter(&self.inner);
        let mut g = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !self.inner.set.load(Ordering::SeqCst) {
            g = self.inner.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks the calling thread until the event is set, where tasks of
    /// the runtime `driver` set it. In a task braid spawned on a
    /// multi-thread runtime (a rank's job, a graph's node: [`spawned_task`]),
    /// the worker first hands its other tasks to another thread
    /// (`tokio::task::block_in_place`), so a task that waits does not hold
    /// the only worker its collective runs on. In the future a
    /// current-thread runtime `driver` runs with `block_on`, or in a task
    /// braid spawned on it, nothing else could set the event: refused
    /// ([`BlockingOnDriver`]). Elsewhere the thread just blocks. Two cases
    /// tokio gives no way to tell apart stay the caller's to avoid: a task
    /// of the caller's own spawned on a current-thread `driver` (it shares
    /// the thread that would have to set the event; a thread of that
    /// runtime's blocking pool looks the same and may wait), and a
    /// task of the caller's own on a multi-thread runtime with no other
    /// worker free to run the collective (`block_in_place` is used only in
    /// braid's own tasks: elsewhere, in a `LocalSet` on a `block_on` thread
    /// or a blocking-pool thread, which look the same, it panics).
    pub fn wait_blocking_beside(&self, driver: tokio::runtime::Id) -> Result<(), BlockingOnDriver> {
        if self.is_set() {
            return Ok(());
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => match h.runtime_flavor() {
                // The driver's `block_on`, or a task braid spawned on it
                // (both run on its one thread).
                tokio::runtime::RuntimeFlavor::CurrentThread
                    if h.id() == driver
                        && (tokio::task::try_id().is_none() || in_spawned_task()) =>
                {
                    return Err(BlockingOnDriver);
                }
                tokio::runtime::RuntimeFlavor::CurrentThread => self.wait_blocking(),
                _ if in_spawned_task() => {
                    tokio::task::block_in_place(|| self.wait_blocking());
                }
                _ => self.wait_blocking(),
            },
            Err(_) => self.wait_blocking(),
        }
        Ok(())
    }

    /// Like [`Event::wait_blocking`] with a time limit; returns whether the
    /// event was set.
    pub fn wait_blocking_timeout(&self, timeout: Duration) -> bool {
        let Some(deadline) = std::time::Instant::now().checked_add(timeout) else {
            // Beyond what an Instant holds: no limit in effect.
            self.wait_blocking();
            return true;
        };
        let _b = Blocked::enter(&self.inner);
        let mut g = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !self.inner.set.load(Ordering::SeqCst) {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .inner
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

tokio::task_local! {
    /// Set while a task braid spawned on a runtime's workers (a rank's
    /// job, a graph's node) is polled: `tokio::task::block_in_place` is
    /// allowed there on a multi-thread runtime.
    static SPAWNED_TASK: ();
}

/// Whether the caller runs inside a task braid spawned ([`spawned_task`]).
fn in_spawned_task() -> bool {
    SPAWNED_TASK.try_with(|_| ()).is_ok()
}

/// `fut`, marked as a task spawned on a runtime's workers (for
/// `tokio::spawn` and `JoinSet::spawn` only): a blocking wait inside it
/// moves the worker's other tasks away first
/// ([`Event::wait_blocking_beside`]).
pub fn spawned_task<F: std::future::Future>(
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    SPAWNED_TASK.scope((), fut)
}

/// A blocking wait refused: the calling thread is the only thread of the
/// current-thread runtime whose tasks would set the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a blocking wait on the only thread of the runtime that drives the operation would never \
     end: await the operation instead, or wait from another thread"
)]
pub struct BlockingOnDriver;

/// Counts a thread in `Inner::blocked` for as long as it waits.
struct Blocked<'a>(&'a Inner);

impl<'a> Blocked<'a> {
    fn enter(inner: &'a Inner) -> Self {
        inner.blocked.fetch_add(1, Ordering::SeqCst);
        Blocked(inner)
    }
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.blocked.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_and_async_waiters_wake() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let ev = Event::new();
        let e2 = ev.clone();
        let task = rt.spawn(async move { e2.wait().await });
        let e3 = ev.clone();
        let th = std::thread::spawn(move || e3.wait_blocking());
        assert!(!ev.wait_blocking_timeout(Duration::from_millis(10)));
        ev.set();
        th.join().unwrap();
        rt.block_on(task).unwrap();
        assert!(ev.is_set());
        ev.set();
    }
}
