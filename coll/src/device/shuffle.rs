//! Shuffle of device chunks: insert (partition, chunk) pairs as they
//! stream in, finish, then extract whole partitions on their owners.
//!
//! ```text
//!  insert(p, chunk) ... insert(p', chunk')       (kept, or spilled to host
//!                                                  when over the device limit)
//!  finish:  1. host: to every peer, the partition count and owner
//!              policy (checked: every rank must pass the same), then the
//!              (partition, length) list of the chunks it owns (empty when
//!              none), one frame of the shuffle's kind
//!           2. allocate receive buffers from the lists
//!           3. NCCL group: every chunk to its owner, in list order
//!  extract(p): the partition's chunks (own first, then by source rank)
//! ```
//!
//! A rank's own chunks never move. Spilling applies when the context's
//! `BufferResource` has a non-zero device limit: an inserted or received
//! chunk that does not fit is copied to host (counted in the statistics'
//! spilled bytes) and copied back when it is sent or extracted.

use std::collections::BTreeMap;

use braid_core::cuda::{DeviceBuffer, Resident};
use braid_core::{MemoryType, Rank, Reservation, Tag};
use braid_kernels::DType;

use super::{DeviceComm, finish, nccl_dtype, streaming};
use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start};
use crate::shuffle::{PartitionOwner, same_layout};
use crate::wire::{AGREE_STAGE, none_refused, recv_words, send_words};

struct Held {
    data: Resident,
    _res: Option<Reservation>,
}

/// A device shuffle in progress; create it on every rank in the same order.
pub struct DeviceShuffle {
    dc: DeviceComm,
    site: Site,
    nparts: u32,
    owner: PartitionOwner,
    chunks: Vec<(u32, Held)>,
}

impl std::fmt::Debug for DeviceShuffle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShuffle")
            .field("op", &self.site.op)
            .field("nparts", &self.nparts)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

/// The partitions a rank owns after a device shuffle.
#[derive(Default)]
pub struct DeviceShuffled {
    parts: BTreeMap<u32, Vec<Held>>,
    rank: Rank,
}

impl std::fmt::Debug for DeviceShuffled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShuffled")
            .field("partitions", &self.parts.len())
            .finish()
    }
}

impl DeviceShuffled {
    /// The partitions that arrived (own partitions with no data are absent).
    pub fn partitions(&self) -> Vec<u32> {
        self.parts.keys().copied().collect()
    }

    /// Takes partition `pid`'s chunks, on the device (spilled ones are
    /// copied back).
    pub fn extract(&mut self, pid: u32, dc: &DeviceComm) -> Result<Vec<DeviceBuffer>, CollError> {
        let site = Site {
            rank: self.rank,
            coll: CollKind::Shuffle,
            op: braid_core::OpId(0),
        };
        self.parts
            .remove(&pid)
            .unwrap_or_default()
            .into_iter()
            .map(|h| h.data.into_device(dc.gpu()).map_err(|e| site.device(e)))
            .collect()
    }
}

/// Charges `len` device bytes; spills `data` when the device limit is
/// reached (only when the resource has a non-zero device limit).
fn hold(dc: &DeviceComm, site: &Site, mut data: Resident) -> Result<Held, CollError> {
    let res = dc.ctx().resource();
    let limited = matches!(res.limits().device, Some(l) if l > 0);
    if !limited || data.mem_type() == MemoryType::Host {
        return Ok(Held { data, _res: None });
    }
    let r = res.reserve(data.len() as u64, &[MemoryType::Device]);
    if r.overbooked() == 0 {
        return Ok(Held {
            data,
            _res: Some(r),
        });
    }
    drop(r);
    let mut host = res.reserve(data.len() as u64, &[MemoryType::Host]);
    let n = data.spill(&mut host).map_err(|e| site.device(e))?;
    dc.ctx().statistics().record_spill(n as u64);
    Ok(Held { data, _res: None })
}

impl DeviceShuffle {
    /// A shuffle of `nparts` partitions owned as `owner` says.
    pub fn new(dc: &DeviceComm, nparts: u32, owner: PartitionOwner) -> Self {
        DeviceShuffle {
            dc: dc.clone(),
            site: Site::next(dc.ctx(), CollKind::Shuffle),
            nparts,
            owner,
            chunks: Vec::new(),
        }
    }

    /// Adds a chunk of partition `pid`.
    pub fn insert(&mut self, pid: u32, chunk: DeviceBuffer) -> Result<(), CollError> {
        if pid >= self.nparts {
            return Err(self.site.invalid(format!(
                "partition {pid} out of range ({} partitions)",
                self.nparts
            )));
        }
        let h = hold(&self.dc, &self.site, Resident::Device(chunk))?;
        self.chunks.push((pid, h));
        Ok(())
    }

    /// Core: starts the exchange (no more inserts).
    pub fn start_finish(self, callback: Option<Callback>) -> Handle<DeviceShuffled> {
        let DeviceShuffle {
            dc,
            site,
            nparts,
            owner,
            chunks,
        } = self;
        let slot = dc.nccl().slot();
        let dc2 = dc.clone();
        start(dc.ctx(), site.coll, site.op, callback, async move {
            let dc = dc2;
            let me = dc.rank();
            let n = dc.nranks();
            let comm = dc.ctx().comm().clone();
            let tag = Tag::new(site.op, AGREE_STAGE);
            let mut mine: BTreeMap<u32, Vec<Held>> = BTreeMap::new();
            let mut out: Vec<Vec<(u32, Resident)>> = (0..n).map(|_| Vec::new()).collect();
            for (pid, h) in chunks {
                let o = owner.owner(pid, nparts, n);
                if o == me {
                    mine.entry(pid).or_default().push(h);
                } else {
                    out[o as usize].push((pid, h.data));
                }
            }
            // 1. Lists to every peer, after the layout every rank checks.
            let mut sends = Vec::new();
            for p in (0..n).filter(|&p| p != me) {
                let mut w = Vec::with_capacity(2 + out[p as usize].len() * 2);
                w.extend([u64::from(nparts), owner.code()]);
                for (pid, d) in &out[p as usize] {
                    w.extend([u64::from(*pid), d.len() as u64]);
                }
                sends.push(send_words(comm.as_ref(), site, p, tag, &w));
            }
            none_refused(&sends)?;
            let mut incoming: Vec<(Rank, u32, DeviceBuffer)> = Vec::new();
            for q in (0..n).filter(|&q| q != me) {
                let w = recv_words(comm.as_ref(), site, q, tag).await?;
                let (layout, list) = match w.split_first_chunk::<2>() {
                    Some((l, rest)) if rest.len() % 2 == 0 => (l, rest),
                    _ => return Err(site.mismatch(q, "malformed shuffle list")),
                };
                same_layout(site, q, (nparts, owner), (layout[0], layout[1]))?;
                for c in list.chunks_exact(2) {
                    let (pid, len) = (c[0], c[1]);
                    if pid >= u64::from(nparts) || owner.owner(pid as u32, nparts, n) != me {
                        return Err(site.mismatch(
                            q,
                            format!("rank {q} sends partition {pid}, not owned here"),
                        ));
                    }
                    let len = usize::try_from(len).map_err(|_| {
                        site.mismatch(q, format!("rank {q} sends a chunk of {len} bytes"))
                    })?;
                    let buf = DeviceBuffer::alloc(dc.gpu(), len).map_err(|e| site.device(e))?;
                    incoming.push((q, pid as u32, buf));
                }
            }
            for s in sends {
                s.await?;
            }
            // 2. Outgoing chunks on the device.
            let mut outgoing: Vec<(Rank, DeviceBuffer)> = Vec::new();
            for (p, list) in out.into_iter().enumerate() {
                for (_, d) in list {
                    outgoing.push((
                        p as Rank,
                        d.into_device(dc.gpu()).map_err(|e| site.device(e))?,
                    ));
                }
            }
            // 3. One NCCL group.
            let mut waits = Vec::new();
            let mut keep = Vec::new();
            let mut sw = Vec::new();
            for (p, b) in &outgoing {
                waits.extend(b.ready().cloned());
                keep.push(b.keep_alive());
                if !b.is_empty() {
                    sw.push((b.ptr(), b.len(), *p));
                }
            }
            let mut rw = Vec::new();
            for (q, _, b) in &incoming {
                waits.extend(b.write_waits());
                if !b.is_empty() {
                    rw.push((b.ptr(), b.len(), *q));
                }
            }
            let completion = slot.submit(waits, keep, move |w| {
                w.group(|w| {
                    for &(ptr, len, p) in &sw {
                        w.send(ptr, len, nccl_dtype(DType::Bytes), p)?;
                    }
                    for &(ptr, len, q) in &rw {
                        w.recv(ptr, len, nccl_dtype(DType::Bytes), q)?;
                    }
                    Ok(())
                })
            });
            let ev = finish(&dc, site, async { Ok(()) }, completion).await?;
            drop(outgoing);
            for (_, pid, mut b) in incoming {
                b.set_ready(ev.clone());
                let h = hold(&dc, &site, Resident::Device(b))?;
                mine.entry(pid).or_default().push(h);
            }
            Ok(DeviceShuffled {
                parts: mine,
                rank: me,
            })
        })
    }

    /// Finishes inserting, exchanges, and returns this rank's partitions.
    pub async fn finish(self) -> Result<DeviceShuffled, CollError> {
        streaming(|cb| self.start_finish(cb)).await
    }
}
