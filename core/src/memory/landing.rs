//! Landing zones: a result vector that receives may be written into
//! directly, so a transport that reads its bytes from a socket (tcp) puts
//! a message where the caller wants it instead of in a buffer of its own
//! that the caller then copies out of.
//!
//! ```text
//!   LandingZone<T> (owns the Vec<T>)
//!     ├─ Landing [o0, o0 + l0)  ── moved into a receive (recv_landing)
//!     ├─ Landing [o1, o1 + l1)  ── written by the caller itself
//!     └─ ...                       (regions never overlap)
//!   a landed receive resolves to a Buffer that views its region;
//!   once every Landing and view is dropped, into_vec gives the vector back
//! ```
//!
//! Invariants the safety of the raw writes rests on: a zone hands out
//! each byte in at most one `Landing` (overlaps are refused), a `Landing`
//! is not `Clone` and is written only through `&mut self`, every `Landing`
//! and view keeps the zone (and so the vector's memory) alive, and
//! `into_vec` gives the vector back only when no `Landing` or view is
//! left. So no two writers share a byte, nothing is read while it is
//! written, and nothing is written after the owner has the vector back.
//!
//! Cost: a region check under a lock per `Landing` (one per peer of a
//! collective); nothing per byte.

use std::cell::UnsafeCell;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::Buffer;

/// A vector of plain elements that receives may land in; see the module
/// doc.
pub struct LandingZone<T> {
    mem: Arc<Zone<T>>,
}

/// The shared part: the vector and the regions handed out.
struct Zone<T> {
    vec: UnsafeCell<Vec<T>>,
    /// The vector's first byte (its pointer never changes while shared).
    base: *mut u8,
    /// The vector's length in bytes.
    bytes: usize,
    /// Byte ranges handed out as landings, never overlapping.
    issued: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: the vector is only reached through `base` by the holder of the
// one `Landing` of each region (exclusive by construction), and as a whole
// only by `into_vec`, which requires the last reference. `T: Send` so the
// vector may move between threads with the zone.
unsafe impl<T: Send> Send for Zone<T> {}
// SAFETY: shared references only read `base`, `bytes` and the locked
// `issued`; see the `Send` impl for the vector.
unsafe impl<T: Send> Sync for Zone<T> {}

/// What a `Landing` needs of its zone, without the element type.
trait ZoneMem: Send + Sync {
    fn base(&self) -> *mut u8;
}

impl<T: Send> ZoneMem for Zone<T> {
    fn base(&self) -> *mut u8 {
        self.base
    }
}

impl<T: bytemuck::Pod + Send> LandingZone<T> {
    /// A zone over `vec` (its length stays; its contents are overwritten
    /// only where something lands).
    pub fn new(mut vec: Vec<T>) -> Self {
        let bytes = std::mem::size_of_val(vec.as_slice());
        let base = vec.as_mut_ptr() as *mut u8;
        LandingZone {
            mem: Arc::new(Zone {
                vec: UnsafeCell::new(vec),
                base,
                bytes,
                issued: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The zone's length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.mem.bytes
    }

    /// The region of `len` bytes at byte `offset`: `None` when it does not
    /// lie inside the vector or overlaps a region already handed out.
    pub fn landing(&self, offset: usize, len: usize) -> Option<Landing> {
        let end = offset.checked_add(len)?;
        if end > self.mem.bytes {
            return None;
        }
        let mut issued = self.mem.issued.lock().unwrap_or_else(|p| p.into_inner());
        if len > 0 && issued.iter().any(|&(s, e)| offset < e && s < end) {
            return None;
        }
        if len > 0 {
            issued.push((offset, end));
        }
        Some(Landing {
            zone: self.mem.clone(),
            offset,
            len,
        })
    }

    /// Whether `buf` is the landed view of the region at byte `offset` of
    /// this zone (its bytes are then already in place).
    pub fn holds(&self, buf: &Buffer, offset: usize) -> bool {
        !buf.is_empty()
            && offset < self.mem.bytes
            && buf.len() <= self.mem.bytes - offset
            && std::ptr::eq(
                buf.as_slice().as_ptr(),
                self.mem.base.wrapping_add(offset) as *const u8,
            )
    }

    /// The vector back, once no `Landing` or landed view of this zone is
    /// left; the zone itself otherwise.
    pub fn into_vec(self) -> Result<Vec<T>, Self> {
        match Arc::try_unwrap(self.mem) {
            Ok(z) => Ok(z.vec.into_inner()),
            Err(mem) => Err(LandingZone { mem }),
        }
    }
}

/// One region of a [`LandingZone`]: the only handle through which its
/// bytes are written.
pub struct Landing {
    zone: Arc<dyn ZoneMem>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Landing {
    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the region lies inside the zone's initialised vector
        // (checked when handed out), which lives as long as `self.zone`;
        // this `Landing` is its only handle (regions never overlap, and
        // `Landing` is not `Clone`), borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.zone.base().add(self.offset), self.len) }
    }

    /// The region's bytes, to read.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as in `bytes_mut`, borrowed shared here.
        unsafe { std::slice::from_raw_parts(self.zone.base().add(self.offset), self.len) }
    }

    /// The landed bytes as a buffer that views the region (no copy); the
    /// zone stays shared until the buffer and its clones are dropped.
    pub fn into_buffer(self) -> Buffer {
        Buffer::from_bytes(Bytes::from_owner(Landed(self)))
    }
}

/// A landing whose bytes have arrived, as the owner of a `Bytes`.
struct Landed(Landing);

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_views_and_reclaim() {
        let zone = LandingZone::new(vec![0u32; 8]);
        assert_eq!(zone.len_bytes(), 32);
        let mut a = zone.landing(0, 8).unwrap();
        let mut b = zone.landing(16, 16).unwrap();
        // Overlaps and regions past the end are refused.
        assert!(zone.landing(4, 8).is_none());
        assert!(zone.landing(24, 16).is_none());
        assert!(zone.landing(usize::MAX, 2).is_none());
        a.bytes_mut().copy_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        b.bytes_mut().fill(0xff);
        let view = b.into_buffer();
        assert!(zone.holds(&view, 16));
        assert!(!zone.holds(&view, 0));
        assert!(!zone.holds(&Buffer::from_vec(vec![0; 16]), 16));
        // Not back while a landing or a view is alive.
        let zone = zone.into_vec().err().unwrap();
        drop(a);
        let zone = zone.into_vec().err().unwrap();
        drop(view);
        let v = zone.into_vec().ok().unwrap();
        assert_eq!(v, vec![1, 2, 0, 0, u32::MAX, u32::MAX, u32::MAX, u32::MAX]);
    }

    #[test]
    fn a_view_outlives_the_zone_handle() {
        let zone = LandingZone::new(vec![0u8; 4]);
        let mut l = zone.landing(1, 2).unwrap();
        l.bytes_mut().copy_from_slice(&[7, 9]);
        drop(zone);
        let view = l.into_buffer();
        assert_eq!(view.as_slice(), &[7, 9]);
    }
}
