//! `BufferResource`: per-memory-type limits and reservations.
//!
//! A caller first reserves the bytes it is about to need, then allocates
//! (or adopts received bytes) against the reservation. `reserve` may
//! overbook (the caller is expected to spill to make room); `reserve_or_fail`
//! never does.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};

use super::buffer::{Buffer, MemoryType};
use crate::error::MemoryError;

/// Limits per memory type; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Device memory limit in bytes.
    pub device: Option<u64>,
    /// Host memory limit in bytes.
    pub host: Option<u64>,
}

impl MemoryLimits {
    /// No limits.
    pub const UNLIMITED: MemoryLimits = MemoryLimits {
        device: None,
        host: None,
    };

    fn get(&self, t: MemoryType) -> Option<u64> {
        match t {
            MemoryType::Device => self.device,
            MemoryType::Host => self.host,
        }
    }
}

/// Accounts memory use per type against limits.
pub struct BufferResource {
    limits: MemoryLimits,
    used: [AtomicU64; 2],
    peak: [AtomicU64; 2],
}

impl fmt::Debug for BufferResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferResource")
            .field("limits", &self.limits)
            .field("host_used", &self.used(MemoryType::Host))
            .field("device_used", &self.used(MemoryType::Device))
            .finish()
    }
}

impl BufferResource {
    /// A resource with the given limits (`None`: no limit for that type).
    /// Host-only jobs give the device a limit of 0
    /// ([`BufferResource::unlimited_host`], `world::contexts`), so that
    /// nothing is ever reserved as device memory there.
    pub fn new(limits: MemoryLimits) -> Arc<Self> {
        Arc::new(BufferResource {
            limits,
            used: Default::default(),
            peak: Default::default(),
        })
    }

    /// Host-only and unlimited: the default for host jobs.
    pub fn unlimited_host() -> Arc<Self> {
        Self::new(MemoryLimits {
            device: Some(0),
            host: None,
        })
    }

    /// The limits.
    pub fn limits(&self) -> MemoryLimits {
        self.limits
    }

    /// Bytes of type `t` reserved or allocated now.
    pub fn used(&self, t: MemoryType) -> u64 {
        self.used[t.index()].load(Ordering::Relaxed)
    }

    /// Highest `used(t)` seen.
    pub fn peak(&self, t: MemoryType) -> u64 {
        self.peak[t.index()].load(Ordering::Relaxed)
    }

    /// Bytes of type `t` still free under the limit (`u64::MAX` unlimited).
    pub fn available(&self, t: MemoryType) -> u64 {
        match self.limits.get(t) {
            None => u64::MAX,
            Some(l) => l.saturating_sub(self.used(t)),
        }
    }

    fn try_take(&self, t: MemoryType, size: u64) -> bool {
        if size == 0 {
            // Nothing to take: never refused, even while the type is over
            // its limit (a Shuffle spilled empty chunks to files then).
            return true;
        }
        let limit = self.limits.get(t).unwrap_or(u64::MAX);
        let used = &self.used[t.index()];
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let Some(new) = cur.checked_add(size) else {
                return false;
            };
            if new > limit {
                return false;
            }
            match used.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak[t.index()].fetch_max(new, Ordering::Relaxed);
                    return true;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// Takes `size` past the limit (saturating at `u64::MAX`, which only a
    /// reservation of about that much reaches: the count then says "all").
    fn force_take(&self, t: MemoryType, size: u64) {
        let used = &self.used[t.index()];
        let old = used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_add(size))
            })
            .unwrap_or_else(|u| u);
        self.peak[t.index()].fetch_max(old.saturating_add(size), Ordering::Relaxed);
    }

    fn release(&self, t: MemoryType, size: u64) {
        let _ = self.used[t.index()].fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
            Some(u.saturating_sub(size))
        });
    }

    /// Reserves `size` bytes in the first of `types` with room. When none
    /// has room, overbooks the first type (host memory where `types` is
    /// empty); the returned reservation's `overbooked()` says by how much,
    /// and the caller should spill that much before allocating.
    pub fn reserve(self: &Arc<Self>, size: u64, types: &[MemoryType]) -> Reservation {
        if let Ok(r) = self.reserve_or_fail(size, types) {
            return r;
        }
        let t = types.first().copied().unwrap_or(MemoryType::Host);
        let overbooked = size.saturating_sub(self.available(t));
        self.force_take(t, size);
        Reservation {
            resource: self.clone(),
            mem: t,
            size,
            overbooked,
        }
    }

    /// Reserves `size` bytes in the first of `types` with room, or fails
    /// naming what each type had free.
    pub fn reserve_or_fail(
        self: &Arc<Self>,
        size: u64,
        types: &[MemoryType],
    ) -> Result<Reservation, MemoryError> {
        for &t in types {
            if self.try_take(t, size) {
                return Ok(Reservation {
                    resource: self.clone(),
                    mem: t,
                    size,
                    overbooked: 0,
                });
            }
        }
        let detail = if types.is_empty() {
            "no memory type was offered".to_string()
        } else {
            types
                .iter()
                .map(|t| format!("{t}: {} free", fmt_free(self.available(*t))))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(MemoryError::OutOfMemory { size, detail })
    }
}

fn fmt_free(v: u64) -> String {
    if v == u64::MAX {
        "unlimited".into()
    } else {
        format!("{v} bytes")
    }
}

/// Bytes of one memory type set aside for an upcoming allocation. Dropping
/// it returns what was not allocated.
pub struct Reservation {
    resource: Arc<BufferResource>,
    mem: MemoryType,
    size: u64,
    overbooked: u64,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("mem", &self.mem)
            .field("size", &self.size)
            .field("overbooked", &self.overbooked)
            .finish()
    }
}

impl Reservation {
    /// Remaining reserved bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The memory type reserved.
    pub fn mem_type(&self) -> MemoryType {
        self.mem
    }

    /// How far this reservation went over the limit when it was made.
    pub fn overbooked(&self) -> u64 {
        self.overbooked
    }

    pub(crate) fn take(&mut self, size: u64) -> Result<Arc<Charge>, MemoryError> {
        if size > self.size {
            return Err(MemoryError::ReservationExceeded {
                size,
                remaining: self.size,
            });
        }
        self.size -= size;
        Ok(Arc::new(Charge {
            resource: self.resource.clone(),
            mem: self.mem,
            bytes: size,
        }))
    }

    /// Host buffers are charged only to host reservations: one of device
    /// memory would count host bytes as the device's.
    fn host_only(&self, size: u64) -> Result<(), MemoryError> {
        match self.mem {
            MemoryType::Host => Ok(()),
            MemoryType::Device => Err(MemoryError::NotHost { size }),
        }
    }

    /// Allocates a zeroed host buffer of `size` bytes against this
    /// reservation (of host memory: a device reservation is refused).
    pub fn allocate(&mut self, size: usize) -> Result<Buffer, MemoryError> {
        self.host_only(size as u64)?;
        let charge = self.take(size as u64)?;
        Ok(Buffer::charged(BytesMut::zeroed(size).freeze(), charge))
    }

    /// Charges existing host bytes (a received message, say) to this
    /// reservation (of host memory) without copying them.
    pub fn adopt(&mut self, bytes: Bytes) -> Result<Buffer, MemoryError> {
        self.host_only(bytes.len() as u64)?;
        let charge = self.take(bytes.len() as u64)?;
        Ok(Buffer::charged(bytes, charge))
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.size > 0 {
            self.resource.release(self.mem, self.size);
        }
    }
}

/// The accounting of one allocated buffer; released on drop.
pub(crate) struct Charge {
    resource: Arc<BufferResource>,
    mem: MemoryType,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.resource.release(self.mem, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Edges a user can reach: a reservation of about `u64::MAX` and one
    /// more saturate the count (they overflowed it: a panic in debug
    /// builds, a wrapped count in release) and release it again; no
    /// memory type says so; a device reservation allocates no host bytes.
    #[test]
    fn edges_of_reserving() {
        let br = BufferResource::new(MemoryLimits {
            device: None,
            host: Some(u64::MAX),
        });
        let all = br.reserve_or_fail(u64::MAX, &[MemoryType::Host]).unwrap();
        let more = br.reserve(10, &[MemoryType::Host]);
        assert_eq!(more.overbooked(), 10);
        assert_eq!(br.used(MemoryType::Host), u64::MAX);
        assert_eq!(br.peak(MemoryType::Host), u64::MAX);
        drop((all, more));
        assert_eq!(br.used(MemoryType::Host), 0);
        let e = br.reserve_or_fail(5, &[]).unwrap_err().to_string();
        assert!(e.contains("no memory type was offered"), "{e}");
        let mut dev = br.reserve_or_fail(8, &[MemoryType::Device]).unwrap();
        let e = dev.allocate(8).unwrap_err().to_string();
        assert!(e.contains("device reservation"), "{e}");
        assert!(dev.adopt(Bytes::from_static(b"12345678")).is_err());
        assert_eq!(dev.size(), 8, "nothing was charged");
        drop(dev);
        assert_eq!(br.used(MemoryType::Device), 0);
    }

    /// An empty reservation is never refused, even over the limit: a
    /// Shuffle spilled each empty chunk to a file of its own while its
    /// rank's memory was overbooked.
    #[test]
    fn nothing_is_always_reservable() {
        let br = BufferResource::new(MemoryLimits {
            device: Some(0),
            host: Some(10),
        });
        let over = br.reserve(25, &[MemoryType::Host]);
        assert_eq!(over.overbooked(), 15);
        let r = br.reserve_or_fail(0, &[MemoryType::Host]);
        assert!(r.is_ok(), "an empty reservation refused while overbooked");
        assert!(br.reserve_or_fail(1, &[MemoryType::Host]).is_err());
        drop((r, over));
        assert_eq!(br.used(MemoryType::Host), 0);
    }

    #[test]
    fn reserve_allocate_release() {
        let br = BufferResource::new(MemoryLimits {
            device: Some(0),
            host: Some(100),
        });
        let mut r = br.reserve_or_fail(60, &MemoryType::ALL).unwrap();
        assert_eq!(r.mem_type(), MemoryType::Host);
        assert_eq!(br.used(MemoryType::Host), 60);
        assert!(br.reserve_or_fail(50, &[MemoryType::Host]).is_err());
        let b = r.allocate(40).unwrap();
        assert_eq!(b.len(), 40);
        assert!(r.allocate(21).is_err());
        drop(r);
        assert_eq!(br.used(MemoryType::Host), 40);
        let b2 = b.clone();
        drop(b);
        assert_eq!(br.used(MemoryType::Host), 40);
        drop(b2);
        assert_eq!(br.used(MemoryType::Host), 0);
        let over = br.reserve(150, &[MemoryType::Host]);
        assert_eq!(over.overbooked(), 50);
        drop(over);
        assert_eq!(br.used(MemoryType::Host), 0);
        assert_eq!(br.peak(MemoryType::Host), 150);
    }
}
