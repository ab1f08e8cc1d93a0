//! AllToAllv on device buffers: per-peer counts and offsets (in bytes),
//! validated against the buffers before anything is enqueued, then one
//! group of `ncclSend`/`ncclRecv` (NCCL has no AllToAllv).
//!
//! With checks on, each rank also tells every peer how much it sends to and
//! expects from it (one 16-byte host message per peer) and all ranks agree
//! on whether every pair matched; a mismatch aborts NCCL and fails every
//! rank instead of leaving a receive waiting for bytes that never come.

use std::sync::Arc;

use braid_core::cuda::DeviceBuffer;
use braid_core::{Buffer, Communicator, Tag};
use braid_kernels::DType;

use super::{Checks, DeviceComm, failed, nccl_dtype, run_with, same_gpu, streaming};
use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle};
use crate::wire::agree;

/// Per-peer byte counts and offsets of one AllToAllv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAllToAllv {
    /// Bytes sent to each rank.
    pub send_counts: Vec<usize>,
    /// Where in the input each rank's bytes start.
    pub send_offsets: Vec<usize>,
    /// Bytes received from each rank.
    pub recv_counts: Vec<usize>,
    /// Where in the output each rank's bytes go.
    pub recv_offsets: Vec<usize>,
}

impl DeviceAllToAllv {
    /// Counts with packed offsets (prefix sums).
    pub fn packed(send_counts: Vec<usize>, recv_counts: Vec<usize>) -> Self {
        let prefix = |c: &[usize]| {
            c.iter()
                .scan(0usize, |acc, &x| {
                    let o = *acc;
                    *acc = acc.saturating_add(x);
                    Some(o)
                })
                .collect::<Vec<_>>()
        };
        DeviceAllToAllv {
            send_offsets: prefix(&send_counts),
            recv_offsets: prefix(&recv_counts),
            send_counts,
            recv_counts,
        }
    }

    fn validate(
        &self,
        site: &Site,
        n: usize,
        input: usize,
        output: usize,
    ) -> Result<(), CollError> {
        for (name, v) in [
            ("send_counts", &self.send_counts),
            ("send_offsets", &self.send_offsets),
            ("recv_counts", &self.recv_counts),
            ("recv_offsets", &self.recv_offsets),
        ] {
            if v.len() != n {
                return Err(site.invalid(format!("{name} has {} entries for {n} ranks", v.len())));
            }
        }
        for (side, counts, offsets, len) in [
            ("send", &self.send_counts, &self.send_offsets, input),
            ("recv", &self.recv_counts, &self.recv_offsets, output),
        ] {
            for p in 0..n {
                match offsets[p].checked_add(counts[p]) {
                    Some(end) if end <= len => {}
                    _ => {
                        return Err(site.invalid(format!(
                            "{side} range for rank {p} ({} + {}) is outside the {len}-byte buffer",
                            offsets[p], counts[p]
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Checks every pair's counts with the peers; all ranks agree on the
/// outcome.
async fn pair_check(
    comm: Arc<dyn Communicator>,
    site: Site,
    send: Vec<usize>,
    recv: Vec<usize>,
) -> Result<(), CollError> {
    let me = site.rank;
    let n = comm.nranks();
    let tag = Tag::new(site.op, 1);
    let mut sends = Vec::new();
    for p in (0..n).filter(|&p| p != me) {
        let mut b = Vec::with_capacity(16);
        b.extend_from_slice(&(send[p as usize] as u64).to_le_bytes());
        b.extend_from_slice(&(recv[p as usize] as u64).to_le_bytes());
        sends.push(comm.send(p, tag, Buffer::from_vec(b)));
    }
    let mut bad: Option<CollError> = None;
    for q in (0..n).filter(|&q| q != me) {
        let m = comm.recv(q, tag).await.map_err(|e| site.comm(e))?;
        let b = m.as_slice();
        if b.len() != 16 {
            bad.get_or_insert(site.mismatch(q, "malformed count message"));
            continue;
        }
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let (they_send, they_recv) = (w(0), w(1));
        if they_send != recv[q as usize] as u64 || they_recv != send[q as usize] as u64 {
            bad.get_or_insert(site.mismatch(
                q,
                format!(
                    "rank {q} sends {they_send} and expects {they_recv} bytes; this rank expects {} and sends {}",
                    recv[q as usize], send[q as usize]
                ),
            ));
        }
    }
    for s in sends {
        s.await.map_err(|e| site.comm(e))?;
    }
    let (_, hi) = agree(comm.as_ref(), site, [u64::from(bad.is_some()), 0]).await?;
    if let Some(e) = bad {
        return Err(e);
    }
    if hi[0] != 0 {
        return Err(site.disagreement("AllToAllv counts of other ranks disagree"));
    }
    Ok(())
}

/// Core of [`alltoallv`].
pub fn start_alltoallv(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    spec: DeviceAllToAllv,
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let site = Site::next(dc.ctx(), CollKind::AllToAll);
    let n = dc.nranks() as usize;
    let valid = (|| {
        same_gpu(dc, &site, input)?;
        same_gpu(dc, &site, &output)?;
        spec.validate(&site, n, input.len(), output.len())
    })();
    if let Err(e) = valid {
        return failed(dc, site, e, callback);
    }
    let (src, dst) = (input.ptr(), output.ptr());
    let waits = input
        .ready()
        .into_iter()
        .chain(output.ready())
        .cloned()
        .collect();
    let s2 = spec.clone();
    let work = move |w: &braid_core::cuda::NcclWork<'_>| {
        w.group(|w| {
            for p in 0..w.nranks() {
                let i = p as usize;
                if s2.send_counts[i] > 0 {
                    w.send(
                        src + s2.send_offsets[i] as u64,
                        s2.send_counts[i],
                        nccl_dtype(DType::Bytes),
                        p,
                    )?;
                }
                if s2.recv_counts[i] > 0 {
                    w.recv(
                        dst + s2.recv_offsets[i] as u64,
                        s2.recv_counts[i],
                        nccl_dtype(DType::Bytes),
                        p,
                    )?;
                }
            }
            Ok(())
        })
    };
    let on = dc.checks == Checks::Agree && n > 1;
    let check = on.then(|| {
        pair_check(
            dc.ctx().comm().clone(),
            site,
            spec.send_counts,
            spec.recv_counts,
        )
    });
    let mut output = output;
    run_with(
        dc,
        site,
        check,
        waits,
        vec![input.keep_alive()],
        work,
        move |ev| {
            output.set_ready(ev);
            output
        },
        callback,
    )
}

/// AllToAllv: `send_counts[p]` bytes at `send_offsets[p]` of `input` go to
/// rank p; `recv_counts[q]` bytes from rank q land at `recv_offsets[q]` of
/// `output`.
pub async fn alltoallv(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    spec: DeviceAllToAllv,
) -> Result<DeviceBuffer, CollError> {
    streaming(|cb| start_alltoallv(dc, input, output, spec, cb)).await
}
