//! AllToAllv on device buffers: per-peer counts and offsets (in bytes),
//! validated against the buffers before anything is enqueued, then one
//! group of `ncclSend`/`ncclRecv` (NCCL has no AllToAllv).
//!
//! With checks on, every rank gathers every rank's send and receive counts
//! over the host (ceil(log2 N) rounds of small messages, alongside the NCCL
//! work) and checks every pair; all ranks see the same counts, so all reach
//! the same verdict. A mismatch aborts NCCL and fails every rank instead of
//! leaving a receive waiting for bytes that never come.

use std::sync::Arc;

use braid_core::Communicator;
use braid_core::cuda::DeviceBuffer;
use braid_kernels::DType;

use super::{Checks, DeviceComm, failed, nccl_dtype, run_with, same_gpu, streaming};
use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle};
use crate::wire::gather_all;

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
        // Receive ranges that overlap would have two NCCL receives write
        // the same bytes at once (as the host spec refuses them).
        match crate::alltoall::overlapping(&self.recv_offsets, &self.recv_counts) {
            Some((a, b)) => Err(site.invalid(format!("recv ranges of ranks {a} and {b} overlap"))),
            None => Ok(()),
        }
    }
}

/// Checks every pair's counts: every rank gathers every rank's send and
/// receive counts (one dissemination, ceil(log2 N) rounds), so every rank
/// sees the same matrix and reaches the same verdict without a second
/// round.
async fn pair_check(
    comm: Arc<dyn Communicator>,
    site: Site,
    send: Vec<usize>,
    recv: Vec<usize>,
) -> Result<(), CollError> {
    let n = send.len();
    let mine: Vec<u64> = send.iter().chain(recv.iter()).map(|&c| c as u64).collect();
    let all = gather_all(comm.as_ref(), site, mine).await?;
    for (p, row) in all.iter().enumerate() {
        if row.len() != 2 * n {
            return Err(site.mismatch(
                p as u32,
                format!("rank {p} passed counts for {} ranks", row.len() / 2),
            ));
        }
    }
    for (p, row) in all.iter().enumerate() {
        for (q, theirs) in all.iter().enumerate() {
            let (sent, expected) = (row[q], theirs[n + p]);
            if sent != expected {
                let detail =
                    format!("rank {p} sends {sent} bytes to rank {q}, which expects {expected}");
                let me = site.rank as usize;
                return Err(if p == me {
                    site.mismatch(q as u32, detail)
                } else {
                    site.mismatch(p as u32, detail)
                });
            }
        }
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
    let site = Site::next(dc.ctx(), CollKind::AllToAllv);
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
    let mut waits: Vec<_> = input.ready().into_iter().cloned().collect();
    waits.extend(output.write_waits());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges inside their buffers pass; overlapping receive ranges, or a
    /// range past the buffer, are refused naming the ranks.
    #[test]
    fn overlapping_receive_ranges_are_refused() {
        let site = Site {
            rank: 0,
            coll: CollKind::AllToAllv,
            op: braid_core::OpId(1),
        };
        let spec = |recv_offsets: Vec<usize>| DeviceAllToAllv {
            send_counts: vec![8, 8],
            send_offsets: vec![0, 8],
            recv_counts: vec![8, 8],
            recv_offsets,
        };
        assert!(spec(vec![0, 8]).validate(&site, 2, 16, 16).is_ok());
        assert!(spec(vec![8, 0]).validate(&site, 2, 16, 16).is_ok());
        let e = spec(vec![0, 0])
            .validate(&site, 2, 16, 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ranks 0 and 1 overlap"), "{e}");
        let e = spec(vec![0, 4])
            .validate(&site, 2, 16, 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlap"), "{e}");
        let e = spec(vec![0, 9])
            .validate(&site, 2, 16, 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside"), "{e}");
        // An empty range overlaps nothing.
        let mut s = spec(vec![0, 0]);
        s.recv_counts = vec![16, 0];
        assert!(s.validate(&site, 2, 16, 16).is_ok());
    }
}
