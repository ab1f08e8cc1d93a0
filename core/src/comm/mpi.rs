//! The `mpi` backend (feature `mpi`): ranks started by `mpirun` or `srun`,
//! bytes carried by MPI nonblocking point-to-point.
//!
//! MPI is driven by one progress thread per process, which initialises MPI
//! (`MPI_THREAD_FUNNELED`: only that thread calls MPI) and loops:
//!
//! ```text
//!   take new requests (sends, flushes, abort, shutdown) from async callers
//!   post each send with MPI_Isend; test outstanding sends; answer callers
//!   MPI_Improbe(any source, any tag) -> MPI_Mrecv into a fresh (pooled)
//!   buffer -> the mailbox (per (src, tag) order: MPI does not overtake)
//!   spin while there is traffic, then back off to short sleeps when idle
//! ```
//!
//! Tags: MPI tags are `int` and implementations guarantee as little as
//! 2^15; braid uses `(op mod 2^20) << 8 | stage` (< 2^28, which MPICH and
//! OpenMPI both allow), so two operations 2^20 OpIds apart must not be in
//! flight together.
//!
//! Failures: `abort` calls `MPI_Abort`, which ends every rank of the job;
//! a rank that dies makes the MPI runtime end the others (mpirun, srun), so
//! a job never hangs on a dead rank.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use futures::future::BoxFuture;
use mpi::request::{Request, StaticScope};
use mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Equivalence, Source};
use tokio::sync::oneshot;

use super::mailbox::Mailbox;
use super::{Backend, Communicator, RecvFuture, check_rank};
use crate::Rank;
use crate::error::CommError;
use crate::memory::{Buffer, BufferPool};
use crate::stats::Statistics;
use crate::tag::{OpId, Tag};

/// OpIds are reduced modulo this to fit MPI's tag range.
const OP_WRAP: u32 = 1 << 20;

fn mpi_tag(t: Tag) -> i32 {
    (((t.op.0 % OP_WRAP) << 8) | t.stage as u32) as i32
}

/// The tag a receive waits under: the same reduction as the wire.
fn reduced(t: Tag) -> Tag {
    Tag::new(OpId(t.op.0 % OP_WRAP), t.stage)
}

fn from_mpi_tag(t: i32) -> Tag {
    let t = t as u32;
    Tag::new(OpId(t >> 8), (t & 0xff) as u8)
}

enum Req {
    Send {
        dst: Rank,
        tag: Tag,
        buf: Buffer,
        done: oneshot::Sender<Result<(), CommError>>,
    },
    Flush(oneshot::Sender<()>),
    Abort(String),
    Shutdown(oneshot::Sender<()>),
}

/// One rank of a job started by an MPI launcher.
pub struct MpiComm {
    rank: Rank,
    nranks: u32,
    mailbox: Arc<Mailbox>,
    stats: Arc<Statistics>,
    tx: mpsc::Sender<Req>,
    closed: Arc<AtomicBool>,
}

struct Pending {
    req: Request<'static, [u8], StaticScope>,
    /// Owns the bytes `req` reads; dropped only after `req` completes.
    _buf: Buffer,
    done: oneshot::Sender<Result<(), CommError>>,
}

impl MpiComm {
    /// Initialises MPI on a progress thread and joins MPI_COMM_WORLD.
    /// Call once per process.
    pub fn init() -> Result<MpiComm, CommError> {
        let (tx, rx) = mpsc::channel::<Req>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(Rank, u32), String>>();
        let mailbox = Arc::new(Mailbox::default());
        let mb = mailbox.clone();
        let closed = Arc::new(AtomicBool::new(false));
        let cl = closed.clone();
        let stats_slot: Arc<std::sync::OnceLock<Arc<Statistics>>> = Arc::default();
        let ss = stats_slot.clone();
        std::thread::Builder::new()
            .name("braid-mpi".into())
            .spawn(move || progress(rx, ready_tx, mb, ss, cl))
            .map_err(|e| CommError::Bootstrap {
                rank: 0,
                detail: format!("cannot start the MPI progress thread: {e}"),
            })?;
        let (rank, nranks) = ready_rx
            .recv()
            .map_err(|_| CommError::Bootstrap {
                rank: 0,
                detail: "the MPI progress thread died during MPI_Init".into(),
            })?
            .map_err(|detail| CommError::Bootstrap { rank: 0, detail })?;
        let stats = stats_slot
            .get_or_init(|| Arc::new(Statistics::new(rank, nranks)))
            .clone();
        Ok(MpiComm {
            rank,
            nranks,
            mailbox,
            stats,
            tx,
            closed,
        })
    }
}

/// The progress thread: owns MPI for the life of the process's job.
fn progress(
    rx: mpsc::Receiver<Req>,
    ready: mpsc::Sender<Result<(Rank, u32), String>>,
    mailbox: Arc<Mailbox>,
    stats_slot: Arc<std::sync::OnceLock<Arc<Statistics>>>,
    closed: Arc<AtomicBool>,
) {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        let _ = ready.send(Err("MPI is already initialised in this process".into()));
        return;
    };
    let world = universe.world();
    let (rank, nranks) = (world.rank() as Rank, world.size() as u32);
    let stats = stats_slot
        .get_or_init(|| Arc::new(Statistics::new(rank, nranks)))
        .clone();
    mailbox.set_rank(rank);
    let _ = ready.send(Ok((rank, nranks)));
    let pool = BufferPool::new(1 << 30);
    let mut pending: Vec<Pending> = Vec::new();
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    let mut shutdown: Option<(Request<'static, ()>, oneshot::Sender<()>)> = None;
    let mut shutdown_asked: Option<oneshot::Sender<()>> = None;
    let mut idle = 0u32;
    loop {
        let mut busy = false;
        // 1. New requests.
        loop {
            match rx.try_recv() {
                Ok(Req::Send {
                    dst,
                    tag,
                    buf,
                    done,
                }) => {
                    busy = true;
                    // SAFETY: the slice points into `buf`, which `Pending`
                    // keeps alive (and unmoved: `Bytes` data is on the heap)
                    // until MPI reports the send complete.
                    let data: &'static [u8] =
                        unsafe { std::slice::from_raw_parts(buf.as_slice().as_ptr(), buf.len()) };
                    let req = world.process_at_rank(dst as i32).immediate_send_with_tag(
                        StaticScope,
                        data,
                        mpi_tag(tag),
                    );
                    pending.push(Pending {
                        req,
                        _buf: buf,
                        done,
                    });
                }
                Ok(Req::Flush(done)) => flushes.push(done),
                Ok(Req::Abort(reason)) => {
                    eprintln!("rank {rank}: aborting the MPI job: {reason}");
                    world.abort(1);
                }
                Ok(Req::Shutdown(done)) => shutdown_asked = Some(done),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    // Every handle is gone without a shutdown: leave MPI as
                    // it is (the process is ending).
                    return;
                }
            }
        }
        // 2. Outstanding sends.
        let mut i = 0;
        while i < pending.len() {
            let p = pending.swap_remove(i);
            match p.req.test() {
                Ok(_) => {
                    busy = true;
                    let _ = p.done.send(Ok(()));
                }
                Err(req) => {
                    pending.push(Pending { req, ..p });
                    let last = pending.len() - 1;
                    pending.swap(i, last);
                    i += 1;
                }
            }
        }
        if pending.is_empty() {
            for f in flushes.drain(..) {
                let _ = f.send(());
            }
        }
        // 3. Incoming messages.
        while let Some((msg, status)) = world.any_process().immediate_matched_probe() {
            busy = true;
            let len = status.count(u8::equivalent_datatype()).max(0) as usize;
            // MPI overwrites every byte: a reused buffer needs no clearing.
            let mut v = pool.take_filled(len);
            let st = msg.matched_receive_into(&mut v[..]);
            let src = st.source_rank() as Rank;
            stats.record_recv(src, len);
            mailbox.deliver(
                src,
                from_mpi_tag(st.tag()),
                Buffer::from_bytes(pool.wrap(v)),
            );
        }
        // 4. Shutdown: once our sends are out, a nonblocking barrier (we keep
        // receiving meanwhile, so no peer's large send can stall).
        if pending.is_empty() {
            if let Some(done) = shutdown_asked.take() {
                shutdown = Some((world.immediate_barrier(), done));
            }
        }
        if let Some((req, done)) = shutdown.take() {
            match req.test() {
                Ok(_) => {
                    closed.store(true, Ordering::Release);
                    drop(rx);
                    // MPI_Finalize before answering: the process may end as
                    // soon as shutdown returns.
                    drop(universe);
                    let _ = done.send(());
                    return;
                }
                Err(req) => shutdown = Some((req, done)),
            }
        }
        // Sends in flight need MPI progress (rendezvous): keep polling them
        // without sleeping.
        if busy || !pending.is_empty() {
            idle = 0;
        } else {
            idle = idle.saturating_add(1);
            if idle > 2000 {
                std::thread::sleep(Duration::from_micros(50));
            } else if idle > 100 {
                std::thread::yield_now();
            }
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn nranks(&self) -> u32 {
        self.nranks
    }

    fn backend(&self) -> Backend {
        Backend::Mpi
    }

    fn send(&self, dst: Rank, tag: Tag, data: Buffer) -> BoxFuture<'static, Result<(), CommError>> {
        if let Err(e) = check_rank(self.rank, dst, self.nranks) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let rank = self.rank;
        if self.closed.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Err(CommError::Shutdown { rank })));
        }
        self.stats.record_send(dst, data.len());
        let (done, rx) = oneshot::channel();
        if self
            .tx
            .send(Req::Send {
                dst,
                tag: reduced(tag),
                buf: data,
                done,
            })
            .is_err()
        {
            return Box::pin(std::future::ready(Err(CommError::Shutdown { rank })));
        }
        Box::pin(async move { rx.await.unwrap_or(Err(CommError::Shutdown { rank })) })
    }

    fn recv(&self, src: Rank, tag: Tag) -> RecvFuture {
        if let Err(e) = check_rank(self.rank, src, self.nranks) {
            return RecvFuture::ready(Err(e));
        }
        self.mailbox.recv(src, reduced(tag))
    }

    fn abort(&self, reason: &str) {
        let _ = self.tx.send(Req::Abort(reason.to_string()));
        // MPI_Abort ends this process too; give it a moment.
        std::thread::sleep(Duration::from_secs(5));
    }

    fn failure(&self) -> Option<CommError> {
        self.mailbox.failure()
    }

    fn shutdown(&self) -> BoxFuture<'static, Result<(), CommError>> {
        let (ftx, frx) = oneshot::channel();
        let (stx, srx) = oneshot::channel();
        let rank = self.rank;
        let ok = self.tx.send(Req::Flush(ftx)).is_ok() && self.tx.send(Req::Shutdown(stx)).is_ok();
        Box::pin(async move {
            if !ok {
                return Err(CommError::Shutdown { rank });
            }
            let _ = frx.await;
            srx.await.map_err(|_| CommError::Shutdown { rank })
        })
    }

    fn statistics(&self) -> &Arc<Statistics> {
        &self.stats
    }
}
