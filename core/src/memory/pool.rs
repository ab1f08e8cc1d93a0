//! `BufferPool`: reuses large host allocations.
//!
//! Fresh large allocations come from the OS as untouched pages, and the
//! first write to each page faults (several GB/s lost on a 256 MiB message).
//! Received messages are allocated from this pool; when the last handle to
//! such a buffer is dropped its memory goes back to the pool instead of the
//! OS. Only sizes from [`BufferPool::MIN_SIZE`] up are pooled, and the pool
//! keeps at most `max_bytes` idle: a returned buffer that does not fit
//! first evicts idle buffers of the capacities returned least recently, so
//! a job that moves on to another message size keeps pooling the new size
//! instead of holding the old one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// A pool of idle large `Vec<u8>` allocations.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Free>,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Free {
    by_cap: BTreeMap<usize, Class>,
    bytes: usize,
    /// Counts returns; a class remembers the count of its latest return.
    clock: u64,
}

/// Idle buffers of one capacity.
#[derive(Debug, Default)]
struct Class {
    bufs: Vec<Vec<u8>>,
    last_given: u64,
}

struct Pooled {
    v: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.v
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(p) = self.pool.upgrade() {
            p.give(std::mem::take(&mut self.v));
        }
    }
}

impl BufferPool {
    /// Smallest allocation worth pooling (smaller ones are cheap anyway).
    pub const MIN_SIZE: usize = 256 << 10;

    /// A pool keeping at most `max_bytes` idle.
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            free: Mutex::new(Free::default()),
            max_bytes,
        })
    }

    /// An empty vector with capacity for at least `len` bytes: a pooled one
    /// of at most twice that capacity if there is one. `None` where the
    /// allocator cannot provide `len` bytes (the length may be a peer's
    /// claim: a refusal must not abort the process).
    pub fn try_take(&self, len: usize) -> Option<Vec<u8>> {
        let mut v = self.take_raw(len)?;
        v.clear();
        Some(v)
    }

    fn take_raw(&self, len: usize) -> Option<Vec<u8>> {
        if len >= Self::MIN_SIZE {
            let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let cap = f
                .by_cap
                .range(len..=len.saturating_mul(2))
                .next()
                .map(|(c, _)| *c);
            if let Some(cap) = cap {
                if let Some(class) = f.by_cap.get_mut(&cap) {
                    if let Some(v) = class.bufs.pop() {
                        if class.bufs.is_empty() {
                            f.by_cap.remove(&cap);
                        }
                        f.bytes -= v.capacity();
                        return Some(v);
                    }
                }
            }
        }
        super::try_large_vec(len)
    }

    /// Wraps `v` as `Bytes` (no copy) whose memory returns to this pool.
    pub fn wrap(self: &Arc<Self>, v: Vec<u8>) -> Bytes {
        if v.capacity() < Self::MIN_SIZE {
            return Bytes::from(v);
        }
        Bytes::from_owner(Pooled {
            v,
            pool: Arc::downgrade(self),
        })
    }

    fn give(&self, v: Vec<u8>) {
        let cap = v.capacity();
        if cap > self.max_bytes {
            return;
        }
        // Evicted buffers are freed after the lock is released (freeing a
        // large one unmaps it: receivers should not wait on that).
        let mut evicted: Vec<Vec<u8>> = Vec::new();
        let mut guard = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let f = &mut *guard;
        // Room for it: evict other capacities, least recently returned first.
        while f.bytes + cap > self.max_bytes {
            let Some(old) = f
                .by_cap
                .iter()
                .filter(|(c, _)| **c != cap)
                .min_by_key(|(_, class)| class.last_given)
                .map(|(c, _)| *c)
            else {
                drop(guard);
                drop(evicted);
                return;
            };
            if let Some(class) = f.by_cap.get_mut(&old) {
                if let Some(gone) = class.bufs.pop() {
                    f.bytes -= gone.capacity();
                    evicted.push(gone);
                }
                if class.bufs.is_empty() {
                    f.by_cap.remove(&old);
                }
            }
        }
        f.clock += 1;
        let now = f.clock;
        f.bytes += cap;
        let class = f.by_cap.entry(cap).or_default();
        class.bufs.push(v);
        class.last_given = now;
        drop(guard);
        drop(evicted);
    }

    /// Bytes held idle.
    pub fn idle_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_and_bounds() {
        let pool = BufferPool::new(3 << 20);
        let mut v = pool.try_take(1 << 20).unwrap();
        v.resize(1 << 20, 7);
        let ptr = v.as_ptr();
        let b = pool.wrap(v);
        assert_eq!(b.len(), 1 << 20);
        let b2 = b.clone();
        drop(b);
        assert_eq!(pool.idle_bytes(), 0);
        drop(b2);
        assert_eq!(pool.idle_bytes(), 1 << 20);
        let v = pool.try_take(900 << 10).unwrap();
        assert_eq!(v.as_ptr(), ptr);
        assert!(v.is_empty());
        // Too small to match a 4 MiB buffer's pool slot.
        let big = pool.try_take(4 << 20).unwrap();
        assert!(big.capacity() >= 4 << 20);
        let mut big = big;
        big.resize(4 << 20, 0);
        drop(pool.wrap(big));
        assert_eq!(pool.idle_bytes(), 0, "over the limit: not kept");
    }

    /// Returns `n` fresh buffers of `size` bytes to `pool`; their addresses.
    fn give_fresh(pool: &Arc<BufferPool>, n: usize, size: usize) -> Vec<usize> {
        let vs: Vec<Vec<u8>> = (0..n).map(|_| vec![1u8; size]).collect();
        let ptrs = vs.iter().map(|v| v.as_ptr() as usize).collect();
        for v in vs {
            drop(pool.wrap(v));
        }
        ptrs
    }

    #[test]
    fn a_new_size_evicts_the_least_recent_one() {
        let mib = 1 << 20;
        let pool = BufferPool::new(8 * mib);
        give_fresh(&pool, 4, mib); // 4 MiB of 1 MiB buffers (oldest)
        give_fresh(&pool, 1, 2 * mib); // then one of 2 MiB
        assert_eq!(pool.idle_bytes(), 6 * mib);
        let new = give_fresh(&pool, 1, 2 * mib); // fills the pool exactly
        assert_eq!(pool.idle_bytes(), 8 * mib);
        // A third 2 MiB buffer: two 1 MiB ones (the older class) make room.
        give_fresh(&pool, 1, 2 * mib);
        assert_eq!(pool.idle_bytes(), 8 * mib, "every 2 MiB buffer kept");
        let mut left = Vec::new();
        for _ in 0..3 {
            left.push(pool.try_take(2 * mib).unwrap().as_ptr() as usize);
        }
        assert!(left.contains(&new[0]));
        assert_eq!(pool.idle_bytes(), 2 * mib);
        // What is left is 1 MiB buffers (a 2 MiB request cannot use them).
        assert!(pool.try_take(mib).unwrap().capacity() >= mib);
        assert_eq!(pool.idle_bytes(), mib);
        // A buffer larger than the whole pool is never kept, nor evicts.
        give_fresh(&pool, 1, 16 * mib);
        assert_eq!(pool.idle_bytes(), mib);
    }
}
