//! Large host allocations that ask for transparent huge pages.
//!
//! A fresh allocation of many megabytes comes from the OS untouched, and
//! the first write to each 4 KiB page faults. On the 2-core VM of
//! 2026-11-23 copying 64 MiB into a fresh vector took 36-42 ms, into warm
//! memory 6.5 ms, and into a fresh vector advised `MADV_HUGEPAGE` 7.8 ms
//! (one fault per 2 MiB instead of per 4 KiB). Collective outputs and
//! receive buffers are such fresh allocations, so they come from
//! [`large_vec`].
//!
//! The advice is honoured where transparent huge pages are in `madvise` or
//! `always` mode (the Linux default is `madvise`); elsewhere, and on other
//! systems, it is a no-op and the vector is an ordinary one. Where no huge
//! page is free, the kernel compacts memory or falls back to 4 KiB pages
//! (per `/sys/kernel/mm/transparent_hugepage/defrag`); a huge page is only
//! ever requested inside the allocation, so at most two partial huge pages
//! per vector stay on 4 KiB pages.

/// Makes the C allocator keep freed memory for reuse instead of handing
/// it back to the OS at once (glibc; a no-op elsewhere). By default glibc
/// gives each allocation from 128 KiB up its own mapping and unmaps it when
/// freed, so every fresh collective output or received buffer of that size
/// faults in every page again: between two in-process ranks on the 2-core
/// VM of 2026-11-23 a 256 KiB AllReduce took 130-145 us, 49 us with this.
/// Here allocations up to 32 MiB come from malloc's heaps, and a heap is
/// only trimmed once 512 MiB at its top are free. Process-wide, so it is a
/// choice for the program: `run_world` calls it for in-process and tcp
/// ranks, `braid-bench` for its host benchmarks, and the environment
/// variable `BRAID_MALLOC=system` leaves glibc's defaults. Not under MPI:
/// there OpenMPI's single-copy transfers ran 5-15% slower with it.
pub fn reuse_freed_memory() {
    // Read once (a bad value warns once, not at every job's start).
    static SYSTEM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let system =
        *SYSTEM.get_or_init(|| crate::env::choice("BRAID_MALLOC", &[("system", ())]).is_some());
    if system {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes the allocator's parameters; both
        // values are within glibc's accepted ranges (the mmap threshold's
        // maximum on 64-bit is 32 MiB), and a rejected value leaves the
        // parameter as it was.
        let set = unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, REUSED_MAX as libc::c_int) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20) == 1
        };
        REUSING.store(set, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Allocations up to this many bytes come from malloc's heaps once
/// [`reuse_freed_memory`] ran (glibc's largest mmap threshold).
pub(crate) const REUSED_MAX: usize = 32 << 20;

/// Whether [`reuse_freed_memory`] took effect.
static REUSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a fresh allocation of `bytes` likely comes back from memory
/// this process wrote before (freed memory kept for reuse: see
/// [`reuse_freed_memory`]) rather than untouched from the OS. A guess: a
/// heap's first use of its memory is untouched too, but a collective in
/// a loop reuses what the last call freed.
pub(crate) fn likely_reused(bytes: usize) -> bool {
    bytes <= REUSED_MAX && REUSING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Allocations from this many bytes up are advised to use huge pages.
pub const HUGE_PAGE_MIN: usize = 4 << 20;

/// Size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// An empty vector with capacity for `len` elements whose memory, when it
/// is at least [`HUGE_PAGE_MIN`] bytes, is advised to be backed by huge
/// pages before anything touches it.
pub fn large_vec<T>(len: usize) -> Vec<T> {
    advised(Vec::with_capacity(len))
}

/// [`large_vec`] for a length that a peer or a user claims: `None` where
/// the allocator cannot provide it, where `large_vec` would abort the
/// process.
pub fn try_large_vec<T>(len: usize) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    Some(advised(v))
}

/// `v`, its memory advised to use huge pages where it is large enough.
fn advised<T>(v: Vec<T>) -> Vec<T> {
    // Zero-sized elements own no memory (and report an unbounded capacity).
    let bytes = match std::mem::size_of::<T>() {
        0 => 0,
        sz => v.capacity().saturating_mul(sz),
    };
    if bytes >= HUGE_PAGE_MIN {
        advise_huge(v.as_ptr() as usize, bytes);
    }
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(addr: usize, len: usize) {
    // Only whole huge pages inside the allocation: never a byte outside it.
    let start = addr.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let end = (addr + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside the vector's allocation, which
        // this process owns; MADV_HUGEPAGE changes only how its pages are
        // backed, never their contents, and a failure leaves them as they
        // were (so its result needs no handling).
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_addr: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_large_vec_refuses_what_cannot_be_had() {
        let v: Vec<u64> = try_large_vec(1000).unwrap();
        assert!(v.capacity() >= 1000);
        assert!(try_large_vec::<u8>(usize::MAX).is_none());
        assert!(try_large_vec::<u64>(usize::MAX / 4).is_none());
    }

    #[test]
    fn large_vec_has_the_capacity_and_keeps_writes() {
        for len in [0usize, 1, 1000, (HUGE_PAGE_MIN / 8) + 3] {
            let mut v: Vec<u64> = large_vec(len);
            assert!(v.capacity() >= len);
            assert!(v.is_empty());
            v.extend((0..len as u64).map(|i| i * 7));
            assert!(v.iter().enumerate().all(|(i, x)| *x == i as u64 * 7));
        }
        let mut z: Vec<()> = large_vec(10);
        z.push(());
        assert_eq!(z.len(), 1);
    }
}
