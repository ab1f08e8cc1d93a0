//! SendRecv and HaloExchange on device buffers: grouped `ncclSend` /
//! `ncclRecv`.
//!
//! SendRecv: distinct send and receive peers (ring steps). With checks on,
//! the sender also tells the receiver its length over the host (one small
//! frame of the call's kind, under [`AGREE_STAGE`] as every device
//! collective's first host message); a receiver whose buffer has another
//! length fails and aborts the job, which aborts NCCL on every rank.
//!
//! HaloExchange: one object per round, like the host one. Sizes go first
//! over the host (each rank sends a one-word frame to each existing
//! neighbour, 0 when it has nothing), receive buffers are allocated to fit,
//! then one NCCL group moves the non-empty halves. Its NCCL slot is taken
//! when the exchange starts, so its place in the call order is fixed even
//! though it enqueues only after the sizes arrive.

use braid_core::cuda::{DeviceBuffer, GpuEvent, KeepAlive};
use braid_core::{Rank, Tag};
use braid_kernels::DType;

use super::{Checks, DeviceComm, failed, finish, nccl_dtype, run_with, same_gpu, streaming};
use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start};
use crate::wire::{AGREE_STAGE, none_refused, recv_words, send_words};

/// The one word of a size message.
fn one_word(site: &Site, peer: Rank, w: Vec<u64>) -> Result<u64, CollError> {
    match w[..] {
        [x] => Ok(x),
        _ => Err(site.mismatch(peer, format!("size message of {} words", w.len()))),
    }
}

/// The checks of a point-to-point exchange: tells each of `to`'s peers
/// the length this rank sends it, and fails unless each of `from`'s peers
/// sends the length this rank's receive buffer has (a frame of the call's
/// kind each, under [`AGREE_STAGE`]).
async fn sizes_agree(
    comm: std::sync::Arc<dyn braid_core::Communicator>,
    site: Site,
    to: Vec<(usize, Rank)>,
    from: Vec<(usize, Rank)>,
) -> Result<(), CollError> {
    let tag = Tag::new(site.op, AGREE_STAGE);
    let sent: Vec<_> = to
        .iter()
        .map(|&(len, p)| send_words(comm.as_ref(), site, p, tag, &[len as u64]))
        .collect();
    none_refused(&sent)?;
    for (len, p) in from {
        let theirs = one_word(&site, p, recv_words(comm.as_ref(), site, p, tag).await?)?;
        if theirs != len as u64 {
            return Err(site.mismatch(
                p,
                format!("rank {p} sends {theirs} bytes, the receive buffer has {len}"),
            ));
        }
    }
    for f in sent {
        f.await?;
    }
    Ok(())
}

/// Core of [`sendrecv`].
pub fn start_sendrecv(
    dc: &DeviceComm,
    send: Option<(&DeviceBuffer, Rank)>,
    recv: Option<(DeviceBuffer, Rank)>,
    callback: Option<Callback>,
) -> Handle<Option<DeviceBuffer>> {
    let site = Site::next(dc.ctx(), CollKind::SendRecv);
    let n = dc.nranks();
    let valid = (|| {
        for (what, peer) in [
            ("send", send.map(|s| s.1)),
            ("recv", recv.as_ref().map(|r| r.1)),
        ] {
            if let Some(p) = peer {
                if p >= n {
                    return Err(
                        site.invalid(format!("{what} peer {p} out of range (nranks = {n})"))
                    );
                }
            }
        }
        if let Some((b, _)) = send {
            same_gpu(dc, &site, b)?;
        }
        if let Some((b, _)) = &recv {
            same_gpu(dc, &site, b)?;
        }
        Ok(())
    })();
    if let Err(e) = valid {
        return failed(dc, site, e, callback);
    }
    let mut waits: Vec<GpuEvent> = Vec::new();
    let mut keep: Vec<KeepAlive> = Vec::new();
    let s = send.map(|(b, p)| {
        waits.extend(b.ready().cloned());
        keep.push(b.keep_alive());
        (b.ptr(), b.len(), p)
    });
    let r = recv.as_ref().map(|(b, p)| {
        waits.extend(b.write_waits());
        (b.ptr(), b.len(), *p)
    });
    let work = move |w: &braid_core::cuda::NcclWork<'_>| {
        w.group(|w| {
            if let Some((ptr, len, p)) = s {
                if len > 0 {
                    w.send(ptr, len, nccl_dtype(DType::Bytes), p)?;
                }
            }
            if let Some((ptr, len, p)) = r {
                if len > 0 {
                    w.recv(ptr, len, nccl_dtype(DType::Bytes), p)?;
                }
            }
            Ok(())
        })
    };
    let comm = dc.ctx().comm().clone();
    let check = (dc.checks == Checks::Agree).then(|| {
        let to = s.map(|(_, len, p)| (len, p)).into_iter().collect();
        let from = r.map(|(_, len, p)| (len, p)).into_iter().collect();
        sizes_agree(comm, site, to, from)
    });
    run_with(
        dc,
        site,
        check,
        waits,
        keep,
        work,
        move |ev| {
            recv.map(|(mut b, _)| {
                b.set_ready(ev);
                b
            })
        },
        callback,
    )
}

/// Sends `send.0` to rank `send.1` and receives `recv.0` from rank `recv.1`
/// (either may be absent). Every rank calls it (OpIds advance together);
/// lengths of a matched send and receive must be equal.
pub async fn sendrecv(
    dc: &DeviceComm,
    send: Option<(&DeviceBuffer, Rank)>,
    recv: Option<(DeviceBuffer, Rank)>,
) -> Result<Option<DeviceBuffer>, CollError> {
    streaming(|cb| start_sendrecv(dc, send, recv, cb)).await
}

/// What a rank got from its neighbours in one device halo round.
#[derive(Debug, Default)]
pub struct DeviceHalo {
    /// From rank - 1 (its `to_right`); `None` on rank 0; empty when it had
    /// nothing.
    pub from_left: Option<DeviceBuffer>,
    /// From rank + 1 (its `to_left`); `None` on the last rank.
    pub from_right: Option<DeviceBuffer>,
}

/// Rank - 1 and rank + 1 where they exist.
fn neighbours(dc: &DeviceComm) -> (Option<Rank>, Option<Rank>) {
    let (me, n) = (dc.rank(), dc.nranks());
    (me.checked_sub(1), (me + 1 < n).then_some(me + 1))
}

/// One device halo round; create one per round on every rank in the same
/// order, and start each (one dropped unstarted aborts the job: its
/// neighbours would wait for its halo for ever).
#[derive(Debug)]
pub struct DeviceHaloExchange {
    dc: DeviceComm,
    site: Site,
    started: bool,
}

impl DeviceHaloExchange {
    /// A new round (takes the next OpId).
    pub fn new(dc: &DeviceComm) -> Self {
        DeviceHaloExchange {
            dc: dc.clone(),
            site: Site::next(dc.ctx(), CollKind::HaloExchange),
            started: false,
        }
    }

    /// Core: starts the round; `to_left` goes to rank - 1, `to_right` to
    /// rank + 1 (ignored where that neighbour does not exist).
    pub fn start(
        mut self,
        to_left: Option<&DeviceBuffer>,
        to_right: Option<&DeviceBuffer>,
        callback: Option<Callback>,
    ) -> Handle<DeviceHalo> {
        self.started = true;
        let (dc, site) = (self.dc.clone(), self.site);
        let (left, right) = neighbours(&dc);
        for b in to_left.iter().chain(to_right.iter()) {
            if let Err(e) = same_gpu(&dc, &site, b) {
                return failed(&dc, site, e, callback);
            }
        }
        let slot = dc.nccl().slot();
        let out = |b: Option<&DeviceBuffer>, nb: Option<Rank>| {
            nb.and(b)
                .map(|b| (b.ptr(), b.len(), b.ready().cloned(), b.keep_alive()))
        };
        let to_l = out(to_left, left);
        let to_r = out(to_right, right);
        let gpu = dc.gpu().clone();
        let comm = dc.ctx().comm().clone();
        let dc2 = dc.clone();
        start(dc.ctx(), site.coll, site.op, callback, async move {
            let tag = Tag::new(site.op, AGREE_STAGE);
            let len = |x: &Option<(u64, usize, Option<GpuEvent>, KeepAlive)>| {
                x.as_ref().map_or(0, |t| t.1 as u64)
            };
            let mut sends = Vec::new();
            if let Some(l) = left {
                sends.push(send_words(comm.as_ref(), site, l, tag, &[len(&to_l)]));
            }
            if let Some(r) = right {
                sends.push(send_words(comm.as_ref(), site, r, tag, &[len(&to_r)]));
            }
            none_refused(&sends)?;
            let mut sizes = [None, None];
            for (i, nb) in [left, right].into_iter().enumerate() {
                if let Some(p) = nb {
                    let w = recv_words(comm.as_ref(), site, p, tag).await?;
                    sizes[i] = Some(one_word(&site, p, w)? as usize);
                }
            }
            for s in sends {
                s.await?;
            }
            let alloc = |sz: Option<usize>| -> Result<Option<DeviceBuffer>, CollError> {
                sz.map(|s| DeviceBuffer::alloc(&gpu, s).map_err(|e| site.device(e)))
                    .transpose()
            };
            let mut from_left = alloc(sizes[0])?;
            let mut from_right = alloc(sizes[1])?;
            let mut waits = Vec::new();
            let mut keep = Vec::new();
            let mut sends_w = Vec::new();
            for (t, nb) in [(to_l, left), (to_r, right)] {
                if let (Some((ptr, len, ev, k)), Some(p)) = (t, nb) {
                    waits.extend(ev);
                    keep.push(k);
                    if len > 0 {
                        sends_w.push((ptr, len, p));
                    }
                }
            }
            let mut recvs_w = Vec::new();
            for (b, nb) in [(&from_left, left), (&from_right, right)] {
                if let (Some(b), Some(p)) = (b, nb) {
                    waits.extend(b.write_waits());
                    if !b.is_empty() {
                        recvs_w.push((b.ptr(), b.len(), p));
                    }
                }
            }
            let completion = slot.submit(waits, keep, move |w| {
                w.group(|w| {
                    for &(ptr, len, p) in &sends_w {
                        w.send(ptr, len, nccl_dtype(DType::Bytes), p)?;
                    }
                    for &(ptr, len, p) in &recvs_w {
                        w.recv(ptr, len, nccl_dtype(DType::Bytes), p)?;
                    }
                    Ok(())
                })
            });
            let ev = finish(&dc2, site, async { Ok(()) }, completion).await?;
            for b in [&mut from_left, &mut from_right].into_iter().flatten() {
                b.set_ready(ev.clone());
            }
            Ok(DeviceHalo {
                from_left,
                from_right,
            })
        })
    }

    /// Runs the round and returns what the neighbours sent.
    pub async fn exchange(
        self,
        to_left: Option<&DeviceBuffer>,
        to_right: Option<&DeviceBuffer>,
    ) -> Result<DeviceHalo, CollError> {
        streaming(|cb| self.start(to_left, to_right, cb)).await
    }

    /// Core of the sized round: the caller knows how much each neighbour
    /// sends and passes receive buffers of those lengths (`None` where the
    /// neighbour does not exist), so no size round is needed and the round
    /// costs what a SendRecv costs. With checks on, the lengths are
    /// verified against the neighbours' over the host, alongside.
    pub fn start_sized(
        mut self,
        to_left: Option<&DeviceBuffer>,
        to_right: Option<&DeviceBuffer>,
        from_left: Option<DeviceBuffer>,
        from_right: Option<DeviceBuffer>,
        callback: Option<Callback>,
    ) -> Handle<DeviceHalo> {
        self.started = true;
        let (dc, site) = (self.dc.clone(), self.site);
        let (left, right) = neighbours(&dc);
        let bufs = to_left.iter().chain(to_right.iter()).copied();
        let valid = (|| {
            for b in bufs.chain(from_left.iter()).chain(from_right.iter()) {
                same_gpu(&dc, &site, b)?;
            }
            if from_left.is_some() != left.is_some() || from_right.is_some() != right.is_some() {
                return Err(site.invalid(
                    "receive buffers must be given exactly for the neighbours that exist",
                ));
            }
            Ok(())
        })();
        if let Err(e) = valid {
            return failed(&dc, site, e, callback);
        }
        let mut waits: Vec<GpuEvent> = Vec::new();
        let mut keep: Vec<KeepAlive> = Vec::new();
        let mut sends = Vec::new();
        for (b, nb) in [(to_left, left), (to_right, right)] {
            if let Some(p) = nb {
                let len = b.map_or(0, |b| b.len());
                if let Some(b) = b {
                    waits.extend(b.ready().cloned());
                    keep.push(b.keep_alive());
                }
                sends.push((b.map_or(0, |b| b.ptr()), len, p));
            }
        }
        let mut recvs = Vec::new();
        for (b, nb) in [(&from_left, left), (&from_right, right)] {
            if let (Some(b), Some(p)) = (b, nb) {
                waits.extend(b.write_waits());
                recvs.push((b.ptr(), b.len(), p));
            }
        }
        let (s2, r2) = (sends.clone(), recvs.clone());
        let work = move |w: &braid_core::cuda::NcclWork<'_>| {
            w.group(|w| {
                for &(ptr, len, p) in s2.iter().filter(|s| s.1 > 0) {
                    w.send(ptr, len, nccl_dtype(DType::Bytes), p)?;
                }
                for &(ptr, len, p) in r2.iter().filter(|r| r.1 > 0) {
                    w.recv(ptr, len, nccl_dtype(DType::Bytes), p)?;
                }
                Ok(())
            })
        };
        let comm = dc.ctx().comm().clone();
        let check = (dc.checks == Checks::Agree && dc.nranks() > 1).then(|| {
            let to: Vec<_> = sends.iter().map(|&(_, len, p)| (len, p)).collect();
            let from: Vec<_> = recvs.iter().map(|&(_, len, p)| (len, p)).collect();
            sizes_agree(comm, site, to, from)
        });
        run_with(
            &dc,
            site,
            check,
            waits,
            keep,
            work,
            move |ev| {
                let mut h = DeviceHalo {
                    from_left,
                    from_right,
                };
                for b in [&mut h.from_left, &mut h.from_right].into_iter().flatten() {
                    b.set_ready(ev.clone());
                }
                h
            },
            callback,
        )
    }

    /// Runs a sized round (see [`DeviceHaloExchange::start_sized`]).
    pub async fn exchange_sized(
        self,
        to_left: Option<&DeviceBuffer>,
        to_right: Option<&DeviceBuffer>,
        from_left: Option<DeviceBuffer>,
        from_right: Option<DeviceBuffer>,
    ) -> Result<DeviceHalo, CollError> {
        streaming(|cb| self.start_sized(to_left, to_right, from_left, from_right, cb)).await
    }
}

/// A round dropped unstarted took its OpId on this rank, and its
/// neighbours wait for its messages: the job is aborted, naming it.
impl Drop for DeviceHaloExchange {
    fn drop(&mut self) {
        if !self.started {
            self.dc.ctx().comm().abort(&format!(
                "rank {}: device HaloExchange (OpId {}) dropped without being started: \
                 its neighbours would wait for its halo for ever",
                self.site.rank, self.site.op.0
            ));
        }
    }
}
