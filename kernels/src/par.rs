//! Running a kernel's work on scoped threads: [`map_scoped`] splits a list
//! of independent items over up to N threads and returns the results in
//! order. Callers choose N (a rank's share of the host's cores: see
//! `braid_nodes::threads`).

use std::sync::{Arc, Mutex};

/// `f` over `items` on up to `threads` scoped threads (contiguous shares,
/// the caller's thread taking the first, and any share whose thread the OS
/// refuses), results in `items`' order. A panic in `f` goes on in the
/// caller, as it would on one thread.
pub fn map_scoped<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.min(items.len()).max(1);
    if threads == 1 {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(threads);
    let mut shares: Vec<Vec<T>> = Vec::with_capacity(threads);
    let mut it = items.into_iter().peekable();
    while it.peek().is_some() {
        shares.push(it.by_ref().take(per).collect());
    }
    let f = &f;
    std::thread::scope(|s| {
        let mut rest = shares.into_iter();
        let first = rest.next().unwrap_or_default();
        // A share whose thread the OS refuses runs on the caller's thread,
        // after the first share.
        let mut inline = Vec::new();
        let mut handles = Vec::new();
        for (k, share) in rest.enumerate() {
            // The share stays reachable here if the spawn fails.
            let slot = Arc::new(Mutex::new(Some(share)));
            let spawned = std::thread::Builder::new().spawn_scoped(s, {
                let slot = Arc::clone(&slot);
                move || -> Vec<R> {
                    let share = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    share.unwrap_or_default().into_iter().map(f).collect()
                }
            });
            match spawned {
                Ok(h) => handles.push((k, h)),
                Err(_) => {
                    let share = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    inline.push((k, share.unwrap_or_default()));
                }
            }
        }
        let mut parts: Vec<(usize, Vec<R>)> = Vec::with_capacity(threads);
        parts.push((0, first.into_iter().map(f).collect()));
        for (k, share) in inline {
            parts.push((k + 1, share.into_iter().map(f).collect()));
        }
        for (k, h) in handles {
            match h.join() {
                Ok(v) => parts.push((k + 1, v)),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        parts.sort_by_key(|(k, _)| *k);
        parts.into_iter().flat_map(|(_, v)| v).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_scoped_keeps_order_for_any_thread_count() {
        for n in [0usize, 1, 2, 7, 64] {
            let items: Vec<usize> = (0..n).collect();
            let want: Vec<usize> = items.iter().map(|x| x * x + 1).collect();
            for t in [1, 2, 3, 8, 100] {
                let got = map_scoped(items.clone(), t, |x| x * x + 1);
                assert_eq!(got, want, "{n} items, {t} threads");
            }
        }
    }

    #[test]
    fn map_scoped_uses_other_threads() {
        let main = std::thread::current().id();
        let ids = map_scoped((0..4).collect(), 4, |_| std::thread::current().id());
        assert_eq!(ids[0], main);
        assert!(ids[1..].iter().all(|id| *id != main));
    }
}
