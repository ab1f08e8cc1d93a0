//! Point-to-point benchmark: 2 ranks, local and tcp backends, next to a raw
//! tokio TCP socket pair on loopback moving the same bytes, in the same
//! process and runtime. braid's tcp backend splits a message of 256 KiB or
//! more over several connections (`BRAID_TCP_LANES`; 1 keeps one stream,
//! as the raw pair has); the `local` column is buffer handles handed over
//! between in-process ranks, not bytes copied.
//!
//! - Latency: ping-pong of 8 B messages; one-way time = round trip / 2.
//! - Bandwidth: rank 0 sends `iters` messages of `size` bytes back to back,
//!   rank 1 receives them all and answers with 8 B; bytes / time. Each
//!   point is the best of `--reps` runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_core::comm::local::LocalComm;
use braid_core::comm::tcp::TcpComm;
use braid_core::{BoxError, Buffer, Communicator, OpId, Tag};
use braid_examples::{outln, size_name};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Options of `braid-bench comm`.
#[derive(Debug, clap::Args)]
pub struct CommArgs {
    /// Largest message size in bytes (sizes go up by 4x from 1 KiB).
    #[arg(long, default_value_t = 256 << 20)]
    max_size: usize,
    /// Bytes moved per bandwidth measurement (at least 4 messages).
    #[arg(long, default_value_t = 1 << 30)]
    bytes_per_point: usize,
    /// Repetitions per point; the best is kept.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..))]
    pingpongs: u32,
}

const TAG: Tag = Tag::new(OpId(1), 0);
const ACK: Tag = Tag::new(OpId(1), 1);

async fn braid_latency(
    a: Arc<dyn Communicator>,
    b: Arc<dyn Communicator>,
    n: u32,
) -> Result<Duration, BoxError> {
    let msg = Buffer::from_vec(vec![7u8; 8]);
    let echo = tokio::spawn(async move {
        for _ in 0..n {
            let m = b.recv(0, TAG).await?;
            b.send(0, TAG, m).await?;
        }
        Ok::<_, BoxError>(())
    });
    let t = Instant::now();
    for _ in 0..n {
        a.send(1, TAG, msg.clone()).await?;
        a.recv(1, TAG).await?;
    }
    let el = t.elapsed();
    echo.await??;
    Ok(el / (2 * n))
}

async fn braid_bandwidth(
    a: Arc<dyn Communicator>,
    b: Arc<dyn Communicator>,
    size: usize,
    iters: usize,
) -> Result<Duration, BoxError> {
    let msg = Buffer::from_vec(vec![1u8; size]);
    let sink = tokio::spawn(async move {
        for _ in 0..iters {
            let m = b.recv(0, TAG).await?;
            if m.len() != size {
                return Err::<(), BoxError>("short message".into());
            }
        }
        b.send(0, ACK, Buffer::from_vec(vec![0; 8])).await?;
        Ok(())
    });
    let t = Instant::now();
    let mut sends = Vec::with_capacity(iters);
    for _ in 0..iters {
        sends.push(a.send(1, TAG, msg.clone()));
    }
    for s in sends {
        s.await?;
    }
    a.recv(1, ACK).await?;
    let el = t.elapsed();
    sink.await??;
    Ok(el)
}

async fn socket_pair() -> Result<(TcpStream, TcpStream), BoxError> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
    let a = a?;
    let b = b?.0;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

async fn raw_latency(n: u32) -> Result<Duration, BoxError> {
    let (mut a, mut b) = socket_pair().await?;
    let echo = tokio::spawn(async move {
        let mut buf = [0u8; 8];
        for _ in 0..n {
            b.read_exact(&mut buf).await?;
            b.write_all(&buf).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut buf = [7u8; 8];
    let t = Instant::now();
    for _ in 0..n {
        a.write_all(&buf).await?;
        a.read_exact(&mut buf).await?;
    }
    let el = t.elapsed();
    echo.await??;
    Ok(el / (2 * n))
}

async fn raw_bandwidth(size: usize, iters: usize) -> Result<Duration, BoxError> {
    let (mut a, mut b) = socket_pair().await?;
    let sink = tokio::spawn(async move {
        // The receiver reads every message into one reused buffer: the
        // cheapest thing a receiver can do.
        let mut buf = vec![0u8; size];
        for _ in 0..iters {
            b.read_exact(&mut buf).await?;
        }
        b.write_all(&[0u8; 8]).await?;
        Ok::<_, std::io::Error>(())
    });
    let msg = vec![1u8; size];
    let t = Instant::now();
    for _ in 0..iters {
        a.write_all(&msg).await?;
    }
    let mut ack = [0u8; 8];
    a.read_exact(&mut ack).await?;
    let el = t.elapsed();
    sink.await??;
    Ok(el)
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// Runs the benchmark and prints the tables.
pub fn run(args: CommArgs) -> Result<(), BoxError> {
    if args.max_size < 1024 {
        return Err(format!(
            "--max-size {} is below the bandwidth table's first size (1 KiB)",
            args.max_size
        )
        .into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let local: Vec<Arc<dyn Communicator>> = LocalComm::world(2)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect();
        let tcp: Vec<Arc<dyn Communicator>> = TcpComm::in_process_world(2)
            .await?
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect();
        let best = |v: Vec<Duration>| v.into_iter().min().unwrap_or_default();

        outln!("# braid-bench comm: 2 ranks, one process, 2 runtime threads");
        outln!();
        outln!("## latency, 8 B one way (us; ratio = braid tcp / raw tcp, lower is better)");
        outln!();
        outln!("| local us | tcp us | raw tcp us | tcp / raw |");
        outln!("|---:|---:|---:|---:|");
        let (mut l, mut t, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..args.reps {
            l.push(braid_latency(local[0].clone(), local[1].clone(), args.pingpongs).await?);
            t.push(braid_latency(tcp[0].clone(), tcp[1].clone(), args.pingpongs).await?);
            r.push(raw_latency(args.pingpongs).await?);
        }
        let (l, t, r) = (best(l), best(t), best(r));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        outln!(
            "| {:.2} | {:.2} | {:.2} | {:.2} |",
            us(l),
            us(t),
            us(r),
            us(t) / us(r)
        );
        outln!();
        outln!("## bandwidth (GB/s; ratio = braid tcp / raw tcp, higher is better)");
        outln!();
        outln!("| size | local GB/s | tcp GB/s | raw tcp GB/s | tcp / raw |");
        outln!("|---:|---:|---:|---:|---:|");
        let mut size = 1usize << 10;
        while size <= args.max_size {
            let iters = (args.bytes_per_point / size).clamp(4, 100_000);
            let (mut l, mut t, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..args.reps {
                l.push(braid_bandwidth(local[0].clone(), local[1].clone(), size, iters).await?);
                t.push(braid_bandwidth(tcp[0].clone(), tcp[1].clone(), size, iters).await?);
                r.push(raw_bandwidth(size, iters).await?);
            }
            let bytes = size * iters;
            let (l, t, r) = (
                gbps(bytes, best(l)),
                gbps(bytes, best(t)),
                gbps(bytes, best(r)),
            );
            outln!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                size_name(size),
                l,
                t,
                r,
                t / r
            );
            size *= 4;
        }
        let downs: Vec<_> = local
            .iter()
            .chain(tcp.iter())
            .map(|c| c.shutdown())
            .collect();
        for r in futures::future::join_all(downs).await {
            r?;
        }
        Ok::<_, BoxError>(())
    })
}
