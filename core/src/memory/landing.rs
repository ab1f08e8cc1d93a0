//! Landing zones: a result vector that receives may be written into
//! directly, so a transport that reads its bytes from a socket (tcp) or
//! hands MPI a pointer puts a message where the caller wants it instead of
//! in a buffer of its own that the caller then copies out of.
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
//! A zone is made over a vector's elements (`new`: an `_into` call's
//! vector, whose old contents are overwritten where something lands) or
//! over the spare capacity of a fresh one (`uninit`: a fresh result, whose
//! memory nobody has to zero first). A `Landing` is written front to back
//! (`bytes::BufMut`: a socket reads into its unwritten rest) and counts
//! what it has written; it becomes a readable view only once every byte is
//! written. The owner of an `uninit` zone's vector gets it back empty and
//! writes what did not land before it sets the length
//! (`land_parts` in braid-coll).
//!
//! Invariants the safety of the raw writes rests on: a zone hands out
//! each byte in at most one `Landing` (overlaps are refused), a `Landing`
//! is not `Clone` and is written only through `&mut self`, it is read
//! only as a view made when it is wholly written, every `Landing` and view
//! keeps the zone (and so the vector's memory) alive, and `into_vec` gives
//! the vector back only when no `Landing` or view is left. So no two
//! writers share a byte, nothing is read before it is written or while it
//! is written, and nothing is written after the owner has the vector back.
//!
//! Cost: a region check under a lock per `Landing` (one per peer of a
//! collective); nothing per byte.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes};

use super::Buffer;
use super::copy::{self, Move, Pages};

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
    /// The zone's length in bytes (the vector's length, or for an
    /// `uninit` zone the capacity asked for).
    bytes: usize,
    /// Byte ranges handed out as landings, never overlapping.
    issued: Mutex<Vec<(usize, usize)>>,
    /// Whether the memory was written before (how a fill stores into it).
    pages: Pages,
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
    fn pages(&self) -> Pages;
}

impl<T: Send> ZoneMem for Zone<T> {
    fn base(&self) -> *mut u8 {
        self.base
    }

    fn pages(&self) -> Pages {
        self.pages
    }
}

impl<T: bytemuck::Pod + Send> LandingZone<T> {
    /// A zone over `vec`'s elements (its length stays; its contents are
    /// overwritten only where something lands).
    pub fn new(vec: Vec<T>) -> Self {
        let bytes = std::mem::size_of_val(vec.as_slice());
        Self::over(vec, bytes, Pages::Written)
    }

    /// A zone of `len` elements over a fresh vector's spare capacity:
    /// nothing is zeroed first. [`into_vec`](Self::into_vec) gives the
    /// vector back empty, with room for `len` elements; its owner writes
    /// the elements that did not land before it sets the length. `None`
    /// where the allocator cannot provide `len` elements (a length a peer
    /// claimed, say).
    pub fn uninit(len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let vec = super::try_large_vec::<T>(len)?;
        let pages = if super::large::likely_reused(bytes) {
            Pages::Written
        } else {
            Pages::Fresh
        };
        Some(Self::over(vec, bytes, pages))
    }

    /// A zone of `len` elements in `vec`'s memory where it has room: over
    /// its first `len` elements where it holds that many (an `_into`
    /// call's vector: its old contents overwritten), over its spare
    /// capacity where that suffices (it is emptied first), else over a
    /// fresh vector ([`uninit`](Self::uninit), `vec` dropped). `None`
    /// where a fresh vector cannot be allocated.
    pub fn reusing(mut vec: Vec<T>, len: usize) -> Option<Self> {
        if vec.len() >= len {
            vec.truncate(len);
            return Some(Self::new(vec));
        }
        if vec.capacity() >= len {
            vec.clear();
            let bytes = len.checked_mul(std::mem::size_of::<T>())?;
            // (A kept vector's spare room: written by its earlier use.)
            return Some(Self::over(vec, bytes, Pages::Written));
        }
        drop(vec);
        Self::uninit(len)
    }

    fn over(mut vec: Vec<T>, bytes: usize, pages: Pages) -> Self {
        let base = vec.as_mut_ptr() as *mut u8;
        LandingZone {
            mem: Arc::new(Zone {
                vec: UnsafeCell::new(vec),
                base,
                bytes,
                issued: Mutex::new(Vec::new()),
                pages,
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
            filled: 0,
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
    /// left; the zone itself otherwise. An `uninit` zone's vector comes
    /// back empty (its landed regions written in its spare capacity).
    pub fn into_vec(self) -> Result<Vec<T>, Self> {
        match Arc::try_unwrap(self.mem) {
            Ok(z) => Ok(z.vec.into_inner()),
            Err(mem) => Err(LandingZone { mem }),
        }
    }
}

/// Why [`LandingZone::assemble`] could not give its vector back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// A landing of the zone, or a view of one that is not among the
    /// parts at its own offset, is still alive.
    #[error("a landed region of the result is still held elsewhere")]
    StillHeld,
    /// Two parts share an element (the later one's element offset).
    #[error("two parts of the result overlap at element {offset}")]
    Overlap {
        /// The element offset of the second part.
        offset: usize,
    },
    /// A part does not lie inside the result, or is not whole elements.
    #[error("a part of {bytes} bytes at element {offset} does not fit a result of {len} elements")]
    DoesNotFit {
        /// The part's element offset.
        offset: usize,
        /// Its length in bytes.
        bytes: usize,
        /// The result's length in elements.
        len: usize,
    },
}

impl<T: bytemuck::Pod + Send> LandingZone<T> {
    /// The zone's vector as a whole result of `len_bytes / size_of::<T>()`
    /// elements, from `parts` (element offset, bytes): a part that is this
    /// zone's landed view at its offset is in place already, the others
    /// are copied to their offsets, and elements no part covers are zeroed.
    /// Every element is written (an `uninit` zone's included) before the
    /// vector is handed back; large copies are spread over this rank's
    /// cores (`fill_threads`). Fails, writing nothing, when a part does
    /// not fit or two overlap, and when a landing or another view of the
    /// zone is still alive.
    pub fn assemble(self, mut parts: Vec<(usize, Buffer)>) -> Result<Vec<T>, AssembleError> {
        let sz = std::mem::size_of::<T>().max(1);
        // Landed views: in place already; let go of them, so that no view
        // is left (their bytes count as covered, not copied).
        let mut landed: Vec<(usize, usize)> = Vec::new();
        for (o, part) in parts.iter_mut() {
            if o.checked_mul(sz).is_some_and(|at| self.holds(part, at)) {
                landed.push((*o, part.len()));
                *part = Buffer::default();
            }
        }
        let copied: Vec<(usize, &[u8])> = parts.iter().map(|(o, p)| (*o, p.as_slice())).collect();
        self.assemble_from(&copied, &landed)
    }

    /// As [`LandingZone::assemble`], from parts that are borrowed bytes
    /// (element offset, bytes), all copied in: what a caller that reads
    /// other ranks' buffers in place passes, taking no handle of them.
    pub fn assemble_slices(self, parts: &[(usize, &[u8])]) -> Result<Vec<T>, AssembleError> {
        self.assemble_from(parts, &[])
    }

    /// The result from `parts` to copy and `landed` (element offset,
    /// bytes) regions already in place.
    fn assemble_from(
        self,
        parts: &[(usize, &[u8])],
        landed: &[(usize, usize)],
    ) -> Result<Vec<T>, AssembleError> {
        let sz = std::mem::size_of::<T>().max(1);
        let bytes = self.mem.bytes;
        let len = bytes / sz;
        let mut covered: Vec<(usize, usize)> = Vec::with_capacity(parts.len() + landed.len());
        for (o, n) in parts
            .iter()
            .map(|(o, p)| (*o, p.len()))
            .chain(landed.iter().copied())
        {
            if n == 0 {
                continue;
            }
            let end = o.checked_mul(sz).and_then(|b| b.checked_add(n));
            if n % sz != 0 || end.is_none_or(|e| e > bytes) {
                return Err(AssembleError::DoesNotFit {
                    offset: o,
                    bytes: n,
                    len,
                });
            }
            covered.push((o, o + n / sz));
        }
        covered.sort_unstable();
        // Parts are copied in parallel below: two that share a byte would
        // race, so they are refused (no collective's layout makes them).
        if let Some(w) = covered.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(AssembleError::Overlap { offset: w[1].0 });
        }
        let pages = self.mem.pages;
        let mut v = self.into_vec().map_err(|_| AssembleError::StillHeld)?;
        // The copies of the parts that did not land, and zeroes where no
        // part lies, in one list of moves (spread over threads when large).
        let mut moves: Vec<Move> = Vec::with_capacity(parts.len() * 2 + 1);
        for (o, part) in parts {
            if !part.is_empty() {
                moves.push(Move {
                    at: o * sz,
                    src: Some(part.as_ptr()),
                    len: part.len(),
                });
            }
        }
        let mut at = 0;
        for (s, e) in covered.into_iter().chain([(len, len)]) {
            if s > at {
                moves.push(Move {
                    at: at * sz,
                    src: None,
                    len: (s - at) * sz,
                });
            }
            at = at.max(e);
        }
        // SAFETY: every move lies inside the allocation (parts checked
        // above to end within `bytes`, the vector's length or capacity;
        // gaps within [0, len)); parts do not overlap each other (checked
        // above) nor the gaps (which lie where no part does); a part is
        // never this vector's memory (views of it were let go of, or
        // into_vec would have failed), and the parts' buffers are held,
        // unchanged, for the call.
        unsafe { copy::fill(v.as_mut_ptr() as *mut u8, &moves, pages) };
        // SAFETY: every element of [0, len) is written: a covered one by a
        // landed part (a view exists only once its whole region is
        // written, and a slice of a view lies inside that region) or by
        // the copy above, the others zeroed; any bytes are a valid `T`
        // (Pod); len <= capacity.
        unsafe { v.set_len(len) };
        Ok(v)
    }
}

/// One region of a [`LandingZone`]: the only handle through which its
/// bytes are written, front to back (see the module doc).
pub struct Landing {
    zone: Arc<dyn ZoneMem>,
    offset: usize,
    len: usize,
    /// Bytes written from the region's start.
    filled: usize,
}

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("filled", &self.filled)
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

    /// Bytes written so far, from the region's start.
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// The region's unwritten rest, which may be uninitialised memory.
    ///
    /// # Safety
    ///
    /// The caller writes only initialised bytes into it (never
    /// `MaybeUninit::uninit()`): where the zone was made from an
    /// initialised vector, its bytes go back to that vector's owner as
    /// initialised `T`s, whatever was written or not. (Safe, this let safe
    /// code put uninitialised bytes into a `Vec<T>`; tokio's
    /// `ReadBuf::unfilled_mut` is unsafe for the same reason.)
    pub unsafe fn unfilled(&mut self) -> &mut [MaybeUninit<u8>] {
        let rest = self.len - self.filled;
        if rest == 0 {
            return &mut [];
        }
        // SAFETY: the bytes lie inside the zone's allocation (checked when
        // the region was handed out), which lives as long as `self.zone`;
        // this `Landing` is the region's only handle (regions never
        // overlap, `Landing` is not `Clone`), borrowed mutably here. As
        // `MaybeUninit` they may be uninitialised.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.zone.base().add(self.offset + self.filled) as *mut MaybeUninit<u8>,
                rest,
            )
        }
    }

    /// Writes `src` at the region's unwritten front and counts it written,
    /// as `put_slice` would, but with a result fill's copy (spread over
    /// this rank's cores, streaming stores where large: see
    /// `memory::copy`). `false`, nothing written, where `src` is longer
    /// than the unwritten rest.
    pub fn put_copied(&mut self, src: &[u8]) -> bool {
        if src.len() > self.len - self.filled {
            return false;
        }
        let pages = self.zone.pages();
        // SAFETY: only `src`'s bytes are copied in (below).
        let dst = unsafe { self.unfilled() }.as_mut_ptr() as *mut u8;
        let m = Move {
            at: 0,
            src: Some(src.as_ptr()),
            len: src.len(),
        };
        // SAFETY: the destination is this landing's unwritten rest (its
        // only handle, borrowed mutably: nothing else reads or writes it),
        // at least `src.len()` bytes (checked above); `src` is readable,
        // borrowed for the call (so not written meanwhile), and cannot
        // overlap it: a slice of this zone is a landed view of another
        // region (regions never overlap), and this region's own bytes are
        // reachable only through `&mut self`.
        unsafe { copy::fill(dst, &[m], pages) };
        self.filled += src.len();
        true
    }

    /// Counts the whole region written by someone the landing lent its
    /// memory to (an MPI receive into [`unfilled`](Self::unfilled)'s
    /// pointer).
    ///
    /// # Safety
    /// Every byte of the region from [`filled`](Self::filled) on has been
    /// written.
    pub unsafe fn assume_filled(&mut self) {
        self.filled = self.len;
    }

    /// Splits the region at byte `at`: `self` keeps `[0, at)`, the tail
    /// `[at, len)` comes back as a landing of its own, so that two writers
    /// (a message's pieces read from two sockets) fill one region at once.
    /// `None` (nothing split) when `at` is past the end or inside the
    /// written front. [`unsplit`](Self::unsplit) joins the two again.
    pub fn split_off(&mut self, at: usize) -> Option<Landing> {
        if at > self.len || self.filled > at {
            return None;
        }
        let tail = Landing {
            zone: self.zone.clone(),
            offset: self.offset + at,
            len: self.len - at,
            filled: 0,
        };
        self.len = at;
        Some(tail)
    }

    /// Joins `tail`, the region that follows this one in the same zone (as
    /// [`split_off`](Self::split_off) left it), back on; this region must
    /// be wholly written, so that the written bytes stay one front. The
    /// tail back where it does not follow or this region is not full.
    pub fn unsplit(&mut self, tail: Landing) -> Result<(), Landing> {
        let same = std::ptr::eq(
            Arc::as_ptr(&self.zone) as *const u8,
            Arc::as_ptr(&tail.zone) as *const u8,
        );
        if !same || tail.offset != self.offset + self.len || self.filled != self.len {
            return Err(tail);
        }
        self.len += tail.len;
        self.filled += tail.filled;
        Ok(())
    }

    /// The landed bytes as a buffer that views the region (no copy); the
    /// zone stays shared until the buffer and its clones are dropped. The
    /// landing back where not every byte is written yet. A zero-length
    /// landing gives a plain empty buffer: a view of no bytes would keep
    /// the zone shared for nothing (`Bytes::from_owner` keeps its owner
    /// even when empty), and the zone's `into_vec` would then fail.
    pub fn into_buffer(self) -> Result<Buffer, Landing> {
        if self.filled < self.len {
            return Err(self);
        }
        if self.len == 0 {
            return Ok(Buffer::default());
        }
        Ok(Buffer::from_bytes(Bytes::from_owner(Landed(self))))
    }
}

// SAFETY: `chunk_mut` is the region's unwritten rest (exclusively this
// landing's, see `unfilled`), and `advance_mut` only counts bytes that its
// caller guarantees written, never past the region.
unsafe impl BufMut for Landing {
    fn remaining_mut(&self) -> usize {
        self.len - self.filled
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        self.filled = (self.filled + cnt).min(self.len);
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        // SAFETY: an `UninitSlice` takes writes of initialised bytes only.
        UninitSlice::uninit(unsafe { self.unfilled() })
    }
}

/// A wholly written landing, as the owner of a `Bytes`.
struct Landed(Landing);

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        let l = &self.0;
        if l.len == 0 {
            return &[];
        }
        // SAFETY: as in `Landing::unfilled`; every byte of the region was
        // written (`into_buffer` checked), and nothing writes it any more
        // (the landing is owned here and never written through again).
        unsafe { std::slice::from_raw_parts(l.zone.base().add(l.offset), l.len) }
    }
}

impl<T: bytemuck::Pod + Send> LandingZone<T> {
    /// The vector back with its every element written through `whole`, a
    /// wholly written landing of this zone that covers all of it (the
    /// pieces of an `uninit` or `reusing` zone's one region, joined):
    /// the vector then holds the landed bytes as its elements, nothing
    /// copied. `None` where `whole` is not that (another zone's, a part,
    /// not all written) or another landing or view of the zone is alive;
    /// the zone and `whole` are dropped then.
    pub fn into_landed_vec(self, whole: Landing) -> Option<Vec<T>> {
        let size = std::mem::size_of::<T>();
        let ours = std::ptr::eq(
            Arc::as_ptr(&self.mem) as *const u8,
            Arc::as_ptr(&whole.zone) as *const u8,
        );
        if !ours
            || whole.offset != 0
            || whole.len != self.mem.bytes
            || whole.filled != whole.len
            || size == 0
            || self.mem.bytes % size != 0
        {
            return None;
        }
        let len = self.mem.bytes / size;
        drop(whole);
        let mut v = self.into_vec().ok()?;
        if v.capacity() < len {
            return None;
        }
        // SAFETY: `whole` covered the zone's `bytes` from its base (the
        // vector's first element) and every one of those bytes was written
        // (its `filled` equals its `len`); they lie in the vector's
        // capacity (a zone never exceeds it: `over` is given the vector's
        // length or a capacity checked by `uninit` / `reusing`), and any
        // bytes are a valid `T` (Pod).
        unsafe { v.set_len(len) };
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copied_puts_fill_their_region_and_no_more() {
        let src: Vec<u8> = (0..1000).map(|i| (i * 13 + 1) as u8).collect();
        let zone = LandingZone::new(vec![0u8; 1500]);
        let mut l = zone.landing(250, 1000).unwrap_or_else(|| panic!("landing"));
        assert!(l.put_copied(&src[..600]));
        assert!(!l.put_copied(&src[599..]), "more than the rest: refused");
        assert_eq!(l.filled(), 600);
        assert!(l.put_copied(&src[600..]));
        let view = l.into_buffer().unwrap_or_else(|_| panic!("filled"));
        assert_eq!(view.as_slice(), &src[..]);
        drop(view);
        let v = zone.into_vec().unwrap_or_else(|_| panic!("no views left"));
        assert!(v[..250].iter().chain(&v[1250..]).all(|&b| b == 0));
        assert_eq!(&v[250..1250], &src[..]);
    }

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
        a.put_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        // Not a view until every byte is written.
        b.put_slice(&[0xff; 10]);
        assert_eq!(b.filled(), 10);
        let mut b = b.into_buffer().unwrap_err();
        b.put_slice(&[0xff; 6]);
        assert_eq!(b.remaining_mut(), 0);
        let view = b.into_buffer().unwrap();
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
    fn split_pieces_fill_at_once_and_join_into_the_vector() {
        let zone = LandingZone::<u8>::reusing(Vec::with_capacity(10), 10).unwrap();
        let mut a = zone.landing(0, 10).unwrap();
        // Past the end, or into a written front: refused.
        assert!(a.split_off(11).is_none());
        let mut c = a.split_off(7).unwrap();
        let mut b = a.split_off(3).unwrap();
        assert_eq!((a.len(), b.len(), c.len()), (3, 4, 3));
        // Written in any order, each front to back.
        c.put_slice(&[7, 8, 9]);
        b.put_slice(&[3, 4]);
        a.put_slice(&[0, 1]);
        assert!(a.split_off(1).is_none());
        // Not joined while the front is not full, nor out of order.
        let b = a.unsplit(b).unwrap_err();
        a.put_slice(&[2]);
        let c = a.unsplit(c).unwrap_err();
        a.unsplit(b).unwrap();
        assert_eq!(a.filled(), 5);
        // The front is full only once b's rest is written.
        let c = a.unsplit(c).unwrap_err();
        a.put_slice(&[5, 6]);
        a.unsplit(c).unwrap();
        assert_eq!((a.len(), a.filled()), (10, 10));
        // Another zone's landing does not join.
        let other = LandingZone::new(vec![0u8; 4]);
        let mut o = other.landing(0, 2).unwrap();
        o.put_slice(&[1, 1]);
        let tail = other.landing(2, 2).unwrap();
        assert!(a.unsplit(tail).is_err());
        let v = zone.into_landed_vec(a).unwrap();
        assert_eq!(v, (0..10).collect::<Vec<u8>>());
        // Not all written, or not the whole zone: no vector.
        let zone = LandingZone::<u8>::uninit(4).unwrap();
        let mut l = zone.landing(0, 4).unwrap();
        l.put_slice(&[1, 2, 3]);
        assert!(zone.into_landed_vec(l).is_none());
        let zone = LandingZone::<u32>::uninit(2).unwrap();
        let mut l = zone.landing(0, 4).unwrap();
        l.put_slice(&[1; 4]);
        assert!(zone.into_landed_vec(l).is_none());
        let zone = LandingZone::<u32>::uninit(2).unwrap();
        let mut l = zone.landing(0, 8).unwrap();
        l.put_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(
            zone.into_landed_vec(l).unwrap(),
            vec![
                u32::from_le_bytes([1, 0, 0, 0]),
                u32::from_le_bytes([2, 0, 0, 0])
            ]
        );
    }

    /// An AllReduce block of no elements (more ranks than elements) lands
    /// in a zero-length region: its buffer must not keep the zone shared,
    /// or the result cannot be taken back (it failed as "a landed part is
    /// still held by the transport").
    #[test]
    fn an_empty_landing_keeps_nothing_shared() {
        let zone = LandingZone::new(vec![0u8; 4]);
        let empty = zone.landing(2, 0).unwrap();
        let mut l = zone.landing(0, 4).unwrap();
        l.put_slice(&[1, 2, 3, 4]);
        let view = l.into_buffer().unwrap_or_else(|_| panic!("filled"));
        let none = empty
            .into_buffer()
            .unwrap_or_else(|_| panic!("nothing to fill"));
        assert!(none.is_empty());
        drop(view);
        let v = zone
            .into_vec()
            .unwrap_or_else(|_| panic!("the empty buffer holds the zone"));
        assert_eq!(v, [1, 2, 3, 4]);
        drop(none);
    }

    #[test]
    fn a_view_outlives_the_zone_handle() {
        let zone = LandingZone::new(vec![0u8; 4]);
        let mut l = zone.landing(1, 2).unwrap();
        l.put_slice(&[7, 9]);
        drop(zone);
        let view = l.into_buffer().unwrap();
        assert_eq!(view.as_slice(), &[7, 9]);
    }

    #[test]
    fn an_uninit_zone_lands_in_spare_capacity() {
        let zone = LandingZone::<u64>::uninit(4).unwrap();
        assert_eq!(zone.len_bytes(), 32);
        assert!(zone.landing(24, 16).is_none());
        let mut l = zone.landing(8, 16).unwrap();
        // SAFETY: only its length is read.
        assert_eq!(unsafe { l.unfilled() }.len(), 16);
        let words: Vec<u8> = [5u64, 6].iter().flat_map(|w| w.to_ne_bytes()).collect();
        l.put_slice(&words);
        let view = l.into_buffer().unwrap();
        assert!(zone.holds(&view, 8));
        assert_eq!(view.as_slice(), &words[..]);
        drop(view);
        let mut v = zone.into_vec().ok().unwrap();
        assert!(v.is_empty() && v.capacity() >= 4);
        // The owner writes the rest, then sets the length.
        let p = v.as_mut_ptr();
        // SAFETY: elements 0 and 3 lie in the capacity; 1 and 2 landed.
        unsafe {
            p.write(4);
            p.add(3).write(7);
            v.set_len(4);
        }
        assert_eq!(v, vec![4, 5, 6, 7]);
        assert!(LandingZone::<u64>::uninit(usize::MAX / 4).is_none());
    }

    /// `assemble` against a brute-force layout: landed parts stay, the
    /// others are copied, gaps are zeroed, for both kinds of zone.
    #[test]
    fn reusing_keeps_memory_that_has_room_and_overlaps_are_refused() {
        // Long enough: the same memory, truncated, old contents overwritten.
        let v = vec![7u32; 10];
        let p = v.as_ptr();
        let zone = LandingZone::reusing(v, 6).unwrap();
        let out = zone
            .assemble(vec![(1, Buffer::from_vec(vec![1u8; 8]))])
            .unwrap();
        assert_eq!(out.as_ptr(), p);
        let one = u32::from_ne_bytes([1; 4]);
        assert_eq!(out, vec![0, one, one, 0, 0, 0]);
        // Short but with the capacity: the same memory, every element written.
        let mut v: Vec<u32> = Vec::with_capacity(16);
        v.extend([5, 5]);
        let p = v.as_ptr();
        let zone = LandingZone::reusing(v, 16).unwrap();
        let out = zone.assemble(Vec::new()).unwrap();
        assert_eq!((out.as_ptr(), out), (p, vec![0; 16]));
        // Too small: a fresh vector.
        let zone = LandingZone::reusing(vec![3u32; 2], 4).unwrap();
        assert_eq!(zone.assemble(Vec::new()).unwrap(), vec![0; 4]);
        // Parts that share an element write nothing.
        let zone = LandingZone::new(vec![9u32; 8]);
        let e = zone
            .assemble(vec![
                (0, Buffer::from_vec(vec![0; 12])),
                (2, Buffer::from_vec(vec![0; 8])),
            ])
            .unwrap_err();
        assert_eq!(e, AssembleError::Overlap { offset: 2 });
    }

    #[test]
    fn assemble_writes_every_element_once() {
        let bytes_of = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        for fresh in [false, true] {
            // Result of 12: [0, 3) landed, [3, 5) copied, [5, 7) gap,
            // [7, 11) copied (out of order), [11, 12) gap.
            let zone = if fresh {
                LandingZone::<u32>::uninit(12).unwrap()
            } else {
                LandingZone::new(vec![0xdead_beef_u32; 12])
            };
            let mut l = zone.landing(0, 12).unwrap();
            l.put_slice(&bytes_of(&[10, 11, 12]));
            let landed = l.into_buffer().unwrap();
            let parts = vec![
                (7, Buffer::from_vec(bytes_of(&[70, 71, 72, 73]))),
                (0, landed),
                (3, Buffer::from_vec(bytes_of(&[30, 31]))),
                (11, Buffer::default()),
            ];
            let v = zone.assemble(parts).unwrap();
            assert_eq!(
                v,
                vec![10, 11, 12, 30, 31, 0, 0, 70, 71, 72, 73, 0],
                "fresh: {fresh}"
            );
        }
        // A part past the end, or not whole elements, writes nothing.
        let zone = LandingZone::new(vec![9u32; 4]);
        let e = zone
            .assemble(vec![(3, Buffer::from_vec(vec![0; 8]))])
            .unwrap_err();
        assert!(
            matches!(e, AssembleError::DoesNotFit { offset: 3, .. }),
            "{e}"
        );
        let zone = LandingZone::<u32>::uninit(4).unwrap();
        let e = zone
            .assemble(vec![(0, Buffer::from_vec(vec![0; 6]))])
            .unwrap_err();
        assert!(matches!(e, AssembleError::DoesNotFit { .. }), "{e}");
        // A landing still out keeps the vector.
        let zone = LandingZone::<u32>::uninit(4).unwrap();
        let held = zone.landing(0, 16).unwrap();
        assert_eq!(
            zone.assemble(Vec::new()).unwrap_err(),
            AssembleError::StillHeld
        );
        drop(held);
    }
}
