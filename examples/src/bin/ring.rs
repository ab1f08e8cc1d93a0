//! `ring`: a small multi-rank job. Each rank passes a token of random
//! numbers around the ring; every rank adds its rank to each number; rank 0
//! checks the result against the closed form and prints per-rank
//! statistics. Runs on in-process ranks by default (`--backend tcp` for one
//! process per rank).

use std::process::ExitCode;
use std::time::Instant;

use braid_core::{Buffer, MemoryLimits, OpId, Tag};
use braid_examples::{JobArgs, JobOutcome, init_tracing, run_job};
use braid_examples::{out, outln};
use clap::Parser;

/// Pass a token around a ring of ranks and check it.
#[derive(Debug, Parser)]
#[command(name = "ring", version)]
struct Cli {
    #[command(flatten)]
    job: JobArgs,
    /// Numbers (u64) in the token (each rank holds two tokens at a time).
    #[arg(long, default_value_t = 1 << 20, value_parser = parse_len)]
    len: usize,
    /// Laps around the ring.
    #[arg(long, default_value_t = 10)]
    laps: u32,
}

/// The most numbers a token holds: its bytes must fit in `isize`.
const MAX_LEN: usize = isize::MAX as usize / 8;

/// `--len`, within [`MAX_LEN`].
fn parse_len(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if n > MAX_LEN {
        return Err(format!("at most {MAX_LEN} numbers"));
    }
    Ok(n)
}

/// An empty vector with room for `len` elements of a token, or an error
/// that names the rank and the size where that memory cannot be had.
fn try_vec<T>(rank: u32, len: usize) -> Result<Vec<T>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        format!(
            "rank {rank}: no memory for a token of {} bytes; try a smaller --len",
            len.saturating_mul(std::mem::size_of::<T>())
        )
    })?;
    Ok(v)
}

fn main() -> ExitCode {
    init_tracing();
    let cli = Cli::parse();
    let (len, laps) = (cli.len, cli.laps);
    let start = Instant::now();
    let res = run_job(&cli.job, MemoryLimits::UNLIMITED, move |ctx| async move {
        let (rank, n) = (ctx.rank(), ctx.nranks());
        let comm = ctx.comm().clone();
        let tag = Tag::new(OpId(1), 0);
        let next = (rank + 1) % n;
        let prev = (rank + n - 1) % n;
        let add = |b: &Buffer, r: u32| -> Result<Buffer, String> {
            let mut v = try_vec(rank, b.len())?;
            v.extend(b.as_slice().chunks_exact(8).flat_map(|c| {
                let x = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                x.wrapping_add(r as u64).to_le_bytes()
            }));
            Ok(Buffer::from_vec(v))
        };
        let mut initial: Vec<u64> = try_vec(rank, len)?;
        initial.extend((0..len as u64).map(|i| i.wrapping_mul(0x9e37_79b9)));
        if rank == 0 {
            let mut bytes = try_vec(rank, len.saturating_mul(8))?;
            bytes.extend(initial.iter().flat_map(|x| x.to_le_bytes()));
            let mut token = Buffer::from_vec(bytes);
            for _ in 0..laps {
                comm.send(next, tag, add(&token, 0)?).await?;
                token = comm.recv(prev, tag).await?;
            }
            // Each lap adds 0 + 1 + ... + (n - 1).
            let per_lap = (n as u64) * (n as u64 - 1) / 2;
            if token.len() != initial.len() * 8 {
                return Err(format!(
                    "the token came back with {} bytes, not {}",
                    token.len(),
                    initial.len() * 8
                )
                .into());
            }
            for (i, c) in token.as_slice().chunks_exact(8).enumerate() {
                let got = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                let want = initial[i].wrapping_add(per_lap * laps as u64);
                if got != want {
                    return Err(format!("element {i}: got {got}, expected {want}").into());
                }
            }
        } else {
            for _ in 0..laps {
                let t = comm.recv(prev, tag).await?;
                comm.send(next, tag, add(&t, rank)?).await?;
            }
        }
        Ok((n, ctx.statistics().to_string()))
    });
    match res {
        Ok(JobOutcome::Ran(stats)) => {
            for (_, (_, s)) in &stats {
                out!("{s}");
            }
            // The world's size as the ranks saw it (a launched rank's
            // process is not told `--ranks`).
            if let Some((_, (n, _))) = stats.iter().find(|(r, _)| *r == 0) {
                outln!(
                    "ring ok: {n} ranks, {laps} laps of {len} numbers, {:.3} s",
                    start.elapsed().as_secs_f64()
                );
            }
            ExitCode::SUCCESS
        }
        Ok(JobOutcome::Launched) => ExitCode::SUCCESS,
        Err(e) => {
            braid_examples::errln!("error: {e}");
            // (Stopped by a signal under --backend tcp: 130, as rolling.)
            braid_examples::exit_code(&*e)
        }
    }
}
