//! The SM-driven NVLink SendRecv (feature `cuda`): ring steps (distinct
//! send and receive peers from 3 ranks on) of fresh random bytes at sizes
//! around the 16-byte vector width and the 64 KiB slot, checked byte for
//! byte against what the left neighbour sent; more steps than staging
//! slots (chunk counters carry over between calls); a length mismatch ends
//! in an error on both ranks, not a hang. Staging at the receiver (push)
//! and at the sender (pull). One rank per GPU, as threads;
//! skipped (with a message) below 2 GPUs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use braid_core::cuda::{DeviceBuffer, Gpu};
use braid_core::{MemoryLimits, WorldSpec};
use braid_kernels::gpu::{NvlinkConfig, NvlinkSendRecv, Staging};
use braid_tests::{RANK_COUNTS, payload};

const SIZES: [usize; 10] = [
    0,
    1,
    15,
    16,
    17,
    65_535,
    65_536,
    65_537,
    (8 << 20) + 3,
    33 << 20,
];

#[test]
fn nvlink_ring_steps_deliver() {
    braid_core::cuda::poison_new_allocations(true);
    let gpus = Gpu::count() as u32;
    if gpus < 2 {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "nvlink test skipped: {gpus} CUDA device(s) on this host, 2 needed"
        );
        return;
    }
    let seed = braid_tests::fresh_seed();
    for n in RANK_COUNTS.iter().copied().filter(|&n| n >= 2 && n <= gpus) {
        braid_core::run_world(
            &WorldSpec::Local { nranks: n },
            MemoryLimits::UNLIMITED,
            move |ctx| async move {
                let me = ctx.rank();
                let (right, left) = ((me + 1) % n, (me + n - 1) % n);
                let gpu = Gpu::for_rank(me)?;
                // Both staging places; small slots in the second, so that
                // one call takes many chunks per block.
                for config in [
                    NvlinkConfig::default(),
                    NvlinkConfig {
                        blocks: 7,
                        slots: 3,
                        slot_bytes: 64 * 1024,
                        staging: Staging::AtSender,
                    },
                ] {
                let mut nv = NvlinkSendRecv::with_config(&ctx, gpu.clone(), config).await?;
                for round in 0..3u64 {
                    for (i, &size) in SIZES.iter().enumerate() {
                        let s = seed ^ (round << 40) ^ ((i as u64) << 20);
                        let data = payload(s ^ u64::from(me), size);
                        let input = DeviceBuffer::from_host(&gpu, &data)?;
                        let mut out = DeviceBuffer::alloc(&gpu, size)?;
                        nv.sendrecv(Some((&input, right)), Some((&mut out, left)))
                            .await?;
                        let got = out.to_host()?;
                        let want = payload(s ^ u64::from(left), size);
                        if got != want {
                            let at = got.iter().zip(&want).position(|(a, b)| a != b);
                            return Err(format!(
                                "rank {me}: {size} bytes from rank {left}, round {round}: first difference at {at:?}"
                            )
                            .into());
                        }
                    }
                }
                // A mismatch: rank 0 sends 100 bytes, its right neighbour
                // expects 200. Both of that pair must fail (not hang).
                if me == 0 || me == 1 {
                    let input = DeviceBuffer::alloc(&gpu, 100)?;
                    let mut out = DeviceBuffer::alloc(&gpu, 200)?;
                    let r = if me == 0 {
                        nv.sendrecv(Some((&input, 1)), None).await
                    } else {
                        nv.sendrecv(None, Some((&mut out, 0))).await
                    };
                    match r {
                        Err(e) if e.to_string().contains("length differs") => {}
                        other => return Err(format!("rank {me}: mismatch gave {other:?}").into()),
                    }
                }
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        eprintln!("nvlink ring steps ok on {n} GPUs");
    }
}
