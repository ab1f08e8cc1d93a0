//! The `tcp` backend: one process per rank, tokio TCP between them.
//!
//! ```text
//! bootstrap (control plane, a star around rank 0)
//!   rank r ──connect──> root address (rank 0's listener)
//!   rank r ── Hello{control, token, r} + Register(its data address) ──> 0
//!   0 waits for all ranks, then 0 ── Table(addresses) ──> every rank
//!   the control connections stay open: they carry Done (with the
//!   messages sent to each rank) / Finished (relayed by 0) / AllDone
//!   (shutdown), Abort and Died notices for the rest of the job.
//!
//! data plane (lazy, one direction per connection)
//!   first send r -> d opens r ──Hello{data lane 0, token, r}──> d, then
//!   frames flow r -> d only. Only pairs that talk get sockets.
//!   a message of 2 x STRIPE_PIECE or more goes in k pieces (k up to the
//!   rank's lanes): piece 0 on lane 0 behind a header that announces the
//!   split, piece i on lane i (opened on first use), each written by its
//!   own connection's task and read by its own reader, on the rank's
//!   worker threads at once (`reader::Lanes` for the receiving side).
//! ```
//!
//! Failure detection: rank 0 sees a rank die as an end of its control
//! connection before that rank said Done, and tells every other rank
//! (`Died`); every rank sees rank 0 die as the end of its own control
//! connection. Either way every pending and later operation fails with an
//! error that names the dead rank, within the time the OS takes to close a
//! dead process's sockets (immediate for a killed process on a live host).
//!
//! Cost model: a message costs one 24-byte header plus its payload on the
//! socket. Messages up to 64 KiB are coalesced into one write per batch of
//! queued sends; larger payloads are written straight from the caller's
//! buffer and read straight into a pooled buffer of the frame's size, or,
//! from 64 KiB up, into the caller's own memory where its receive offered
//! it (`recv_landing`; no copy beyond the kernel's either way, but the
//! caller's copy out of the buffer is saved). A connection is read by its
//! task when the socket turns readable, and by a receive from that peer
//! each time the waiting task polls it (`reader`): a rank that polls for
//! a small collective takes the reply off the socket without a thread
//! wake-up.
//!
//! Lanes: one loopback TCP stream moves 4-5 GB/s (a kernel copy on each
//! side, one core each); k streams move k times that on a host with the
//! cores (16 MiB one way, 16-core host: 4.0 GB/s on 1 stream, 8.4 on 2,
//! 14.9 on 4; BENCHMARKS.md, 2026-11-29). A rank uses as many lanes as its
//! runtime has workers, from 2 to `DEFAULT_LANES` (`TcpConfig::lanes`).
//!
//! Flow control: sends are eager; a receiver buffers messages that arrive
//! before their receive is posted. Collectives bound what is in flight.

mod reader;
pub mod wire;
mod writer;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use self::reader::{Lanes, PeerReader, ReadDrive, reader_task};
use self::wire::{
    Answer, ConnKind, Control, FrameHeader, Hello, MAX_LANES, WireError, stripe_piece,
};
use self::writer::{PeerWriter, Sent, Write};
use super::mailbox::Mailbox;
use super::{Backend, Communicator, RecvFuture, SendFuture, check_rank};
use crate::Rank;
use crate::error::CommError;
use crate::event::Event;
use crate::memory::{Buffer, BufferPool, Landing};
use crate::rank_exits::Ended;
use crate::stats::Statistics;
use crate::tag::Tag;

/// Messages from this size up are read straight into the landing of the
/// receive they go to, where it has one (`Communicator::recv_landing`);
/// below it a copy costs less than the lookup.
const LAND_MIN: usize = 64 << 10;
/// Idle receive memory a rank keeps for reuse.
const RECV_POOL_BYTES: usize = 1 << 30;
/// Time a connecting peer has to present its opening.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most ranks a tcp job may have: every rank keeps a connection and
/// per-peer state for each other rank, so a mistyped count should fail
/// here rather than in an allocation.
const MAX_RANKS: u32 = 1 << 16;
/// The least piece a striped message is split into: messages of twice
/// this or more are striped over the lanes, as many pieces as lanes but
/// none smaller than this. 16-core host, 2 and 4 ranks, 8 lanes, pieces of
/// 128 / 256 / 512 KiB alternated (BENCHMARKS.md, 2026-11-29): 1 MiB
/// SendRecv 140-152 / 171-225 / 278-283 us, Broadcast 91-98 / 108-121 /
/// 164-215 us; from 16 MiB level.
const STRIPE_PIECE: usize = 128 << 10;
/// Lanes a rank uses by default, where its runtime has the workers.
pub const DEFAULT_LANES: u8 = 8;

/// How a tcp rank finds and joins its job.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// This rank.
    pub rank: Rank,
    /// Number of ranks.
    pub nranks: u32,
    /// `host:port` where rank 0 listens.
    pub root: String,
    /// The job token every connection must present.
    pub token: String,
    /// Address this rank's data listener binds to (`BRAID_LISTEN`). Rank
    /// 0 binds `root`, or where this is set and not loopback, this address
    /// with `root`'s port. `None` (the default): the address of this
    /// host's interface that reaches `root` (loopback where `root` is on
    /// loopback, as under `braid-launch`), so that ranks on other hosts
    /// reach this one without the listener taking every interface.
    pub listen: Option<IpAddr>,
    /// How long bootstrap and connection set-up may take.
    pub timeout: Duration,
    /// Largest message accepted; frames claiming more are refused.
    pub max_message_bytes: u64,
    /// Data connections to a peer that a large message is split over (1:
    /// never split; at most [`MAX_LANES`]). `None`: as many as the rank's
    /// runtime has worker threads, from 2 to [`DEFAULT_LANES`] (each
    /// lane's bytes are copied by the thread that runs its task).
    pub lanes: Option<u8>,
    /// Rank 0 only: a socket already listening on `root`, inherited from
    /// the launcher (`BRAID_ROOT_FD`, Unix), used instead of binding
    /// `root`: the launcher holds the address from the moment it picks it,
    /// so no other process's connection can take the port before rank 0
    /// binds it ("Address already in use", seen on a busy host).
    pub root_fd: Option<i32>,
    /// The read end of the launcher's pipe of exit notices
    /// (`BRAID_EXITS_FD`, Unix; [`crate::rank_exits`]): in its start-up,
    /// rank 0 fails at once when a rank that has not joined has ended,
    /// and another rank when rank 0 has ended before it could connect,
    /// instead of waiting out `timeout`.
    pub exits_fd: Option<i32>,
}

impl TcpConfig {
    /// Default largest message: 64 GiB.
    pub const DEFAULT_MAX_MESSAGE: u64 = 64 << 30;

    /// A config with defaults for the optional fields.
    pub fn new(rank: Rank, nranks: u32, root: impl Into<String>, token: impl Into<String>) -> Self {
        TcpConfig {
            rank,
            nranks,
            root: root.into(),
            token: token.into(),
            listen: None,
            timeout: Duration::from_secs(60),
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE,
            lanes: None,
            root_fd: None,
            exits_fd: None,
        }
    }

    /// Checks what every rank could otherwise only find out by failing to
    /// join (after retrying for the whole `timeout`): `root` is
    /// `host:port`, and the token fits a handshake.
    pub fn check(&self) -> Result<(), CommError> {
        let bad = |detail: String| CommError::Bootstrap {
            rank: self.rank,
            detail,
        };
        let port = self
            .root
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
            return Err(bad(format!(
                "the root address {:?} (BRAID_ROOT) is not host:port",
                self.root
            )));
        }
        if self.token.len() > wire::MAX_TOKEN_LEN {
            return Err(bad(format!(
                "the job token (BRAID_TOKEN) has {} bytes, more than the {} a handshake carries",
                self.token.len(),
                wire::MAX_TOKEN_LEN
            )));
        }
        Ok(())
    }

    /// Reads `BRAID_RANK`, `BRAID_NRANKS`, `BRAID_ROOT`, `BRAID_TOKEN` and
    /// the optional `BRAID_LISTEN` (IP), `BRAID_TIMEOUT` (seconds),
    /// `BRAID_MAX_MESSAGE` (bytes) and `BRAID_TCP_LANES` (1 to
    /// [`MAX_LANES`]). `Ok(None)` when neither `BRAID_NRANKS` nor
    /// `BRAID_RANK` is set.
    pub fn from_env() -> Result<Option<TcpConfig>, CommError> {
        let get = |k: &str| std::env::var(k).ok();
        let Some(nranks) = get("BRAID_NRANKS") else {
            // A process told its rank but not the job's size is one rank
            // of a job started by hand with a variable left out: run as a
            // job of its own, it would compute (and write) everything.
            if let Some(r) = get("BRAID_RANK") {
                return Err(CommError::Bootstrap {
                    rank: r.parse().unwrap_or(Rank::MAX),
                    detail: format!(
                        "BRAID_RANK={r} is set but BRAID_NRANKS is not: a rank of a tcp job needs BRAID_RANK, BRAID_NRANKS, BRAID_ROOT and BRAID_TOKEN (unset BRAID_RANK to run a job of its own)"
                    ),
                });
            }
            return Ok(None);
        };
        // Errors name this rank once BRAID_RANK reads as one.
        let known = get("BRAID_RANK")
            .and_then(|r| r.parse::<Rank>().ok())
            .unwrap_or(Rank::MAX);
        let bad = |what: String| CommError::Bootstrap {
            rank: known,
            detail: what,
        };
        let nranks: u32 = nranks
            .parse()
            .map_err(|_| bad(format!("BRAID_NRANKS={nranks:?} is not a number")))?;
        let rank_s = get("BRAID_RANK").ok_or_else(|| bad("BRAID_RANK is not set".into()))?;
        let rank: Rank = rank_s
            .parse()
            .map_err(|_| bad(format!("BRAID_RANK={rank_s:?} is not a number")))?;
        if nranks > MAX_RANKS {
            return Err(bad(format!(
                "BRAID_NRANKS={nranks} is more than the {MAX_RANKS} ranks a tcp job may have"
            )));
        }
        if nranks == 0 || rank >= nranks {
            return Err(bad(format!(
                "BRAID_RANK={rank} is not below BRAID_NRANKS={nranks}"
            )));
        }
        let root = get("BRAID_ROOT").ok_or_else(|| bad("BRAID_ROOT is not set".into()))?;
        let token = get("BRAID_TOKEN").ok_or_else(|| bad("BRAID_TOKEN is not set".into()))?;
        let mut c = TcpConfig::new(rank, nranks, root, token);
        if let Some(l) = get("BRAID_LISTEN") {
            c.listen = Some(
                l.parse()
                    .map_err(|_| bad(format!("BRAID_LISTEN={l:?} is not an IP address")))?,
            );
        }
        if let Some(t) = get("BRAID_TIMEOUT") {
            let secs: u64 = t.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                bad(format!(
                    "BRAID_TIMEOUT={t:?} is not a whole number of seconds, at least 1"
                ))
            })?;
            c.timeout = Duration::from_secs(secs);
        }
        if let Some(l) = get("BRAID_TCP_LANES") {
            c.lanes = Some(
                l.parse::<u8>()
                    .ok()
                    .filter(|n| (1..=MAX_LANES).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "BRAID_TCP_LANES={l:?} is not a number from 1 to {MAX_LANES}"
                        ))
                    })?,
            );
        }
        if let Some(fd) = get("BRAID_ROOT_FD").filter(|_| rank == 0) {
            c.root_fd = Some(
                fd.parse::<i32>()
                    .ok()
                    .filter(|fd| *fd >= 0)
                    .ok_or_else(|| bad(format!("BRAID_ROOT_FD={fd:?} is not a descriptor")))?,
            );
        }
        if let Some(fd) = get(crate::rank_exits::EXITS_FD_ENV) {
            // (A value that names no pipe only costs the notices.)
            c.exits_fd = fd.trim().parse::<i32>().ok();
        }
        if let Some(m) = get("BRAID_MAX_MESSAGE") {
            c.max_message_bytes = m
                .trim()
                .parse()
                .ok()
                .filter(|v| *v >= super::MIN_MAX_MESSAGE)
                .ok_or_else(|| {
                    bad(format!(
                        "BRAID_MAX_MESSAGE={m:?} is not a number of bytes of at least {} (a collective's frame header alone takes 32)",
                        super::MIN_MAX_MESSAGE
                    ))
                })?;
        }
        Ok(Some(c))
    }
}

struct Shared {
    rank: Rank,
    nranks: u32,
    token: Vec<u8>,
    root: String,
    timeout: Duration,
    max_message: u64,
    mailbox: Arc<Mailbox>,
    stats: Arc<Statistics>,
    addrs: OnceLock<Vec<String>>,
    /// Lanes a large message to a peer is split over (1: none).
    lanes: u8,
    /// Per (peer, lane) (index `peer * MAX_LANES + lane`): the outgoing
    /// data connection, once used.
    writers: Mutex<Vec<Option<Arc<PeerWriter>>>>,
    /// Per peer: held while a striped message's pieces are queued on its
    /// lanes, so that every lane carries pieces in lane 0's order.
    stripe_order: Vec<Mutex<()>>,
    /// Per (peer, lane): whether its data connection was accepted (one
    /// each: two would interleave its frames and break their order).
    data_accepted: Vec<AtomicBool>,
    /// Rank 0, per rank: whether its control connection was taken (one
    /// process a rank: a second is refused at its handshake, saying why).
    control_taken: Vec<AtomicBool>,
    /// Rank 0: why its start-up failed, once it has (a rank connecting
    /// after that is told so, as the ranks that had joined were).
    start_failed: OnceLock<String>,
    /// Per peer: its lane-0 data connection's reading side, once accepted
    /// (read by its task and by receives waiting for it: `reader`).
    readers: Vec<OnceLock<Arc<PeerReader>>>,
    /// Per peer: the pieces its lanes are to read next (`reader::Lanes`).
    lanes_in: Vec<OnceLock<Arc<Lanes>>>,
    /// Large received messages are allocated from here.
    pool: Arc<BufferPool>,
    control: OnceLock<mpsc::UnboundedSender<CtrlItem>>,
    /// Rank 0 only: the control plane's state.
    root_state: OnceLock<Arc<RootState>>,
    all_done: Event,
    failed: Event,
    shutting_down: AtomicBool,
    runtime: tokio::runtime::Handle,
}

impl Shared {
    fn fail(&self, err: CommError) {
        tracing::debug!(rank = self.rank, error = %err, "tcp communicator failed");
        self.mailbox.fail(err);
        self.failed.set();
    }

    /// Fails this rank for a reason only it has seen (a bad frame, a
    /// broken data connection) and tells every other rank (an Abort through
    /// rank 0), so that none waits for it until its process ends, which a
    /// rank of an in-process world never does.
    fn fail_and_tell(&self, reason: String, err: CommError) {
        if self.mailbox.failure().is_some() {
            return;
        }
        let msg = Control::Abort {
            origin: self.rank,
            reason,
        };
        if let Some(state) = self.root_state.get() {
            state.announce(self, msg, None, err);
            return;
        }
        if let Some(c) = self.control.get() {
            let _ = c.send(CtrlItem::Msg(msg));
        }
        self.fail(err);
    }

    /// [`Shared::fail_and_tell`] with the error's text as the reason.
    fn fail_seen(&self, err: CommError) {
        self.fail_and_tell(err.to_string(), err);
    }

    fn bootstrap_err(&self, detail: impl Into<String>) -> CommError {
        CommError::Bootstrap {
            rank: self.rank,
            detail: detail.into(),
        }
    }
}

/// What a control writer is asked to do.
enum CtrlItem {
    /// Write a message.
    Msg(Control),
    /// Write a message encoded once for every rank (the address table:
    /// a copy per rank would make rank 0's bootstrap memory grow with the
    /// square of the ranks).
    Encoded(Arc<Vec<u8>>),
    /// Answer once everything before it is written.
    Flush(oneshot::Sender<()>),
}

/// Waits (at most `limit`) until everything queued on `senders` is written.
async fn flush_control<'a>(
    senders: impl Iterator<Item = &'a mpsc::UnboundedSender<CtrlItem>>,
    limit: Duration,
) {
    let mut waits = Vec::new();
    for s in senders {
        let (tx, rx) = oneshot::channel();
        if s.send(CtrlItem::Flush(tx)).is_ok() {
            waits.push(rx);
        }
    }
    let _ = tokio::time::timeout(limit, futures::future::join_all(waits)).await;
}

/// Rank 0's view of the control plane.
struct RootState {
    /// Control senders to ranks 1..n (index = rank; entry 0 unused).
    senders: Vec<Option<mpsc::UnboundedSender<CtrlItem>>>,
    done: Mutex<Vec<bool>>,
    /// Set (on rank 0's own shared state) once every rank is done.
    all_done: Event,
    /// Whether a failure has been announced; the lock also orders the
    /// announcement before rank 0's own failure.
    announced: Mutex<bool>,
}

impl RootState {
    fn broadcast(&self, msg: &Control, except: Option<Rank>) {
        for (r, s) in self.senders.iter().enumerate() {
            if Some(r as Rank) == except {
                continue;
            }
            if let Some(s) = s {
                let _ = s.send(CtrlItem::Msg(msg.clone()));
            }
        }
    }

    /// Marks `rank` done; tells everyone when all are.
    fn mark_done(&self, rank: Rank) {
        let all = {
            let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(x) = d.get_mut(rank as usize) {
                *x = true;
            }
            d.iter().all(|x| *x)
        };
        if all && !self.all_done.is_set() {
            self.broadcast(&Control::AllDone, None);
            self.all_done.set();
        }
    }

    /// Announces the job's first failure to every rank but `except`, then
    /// fails rank 0 itself. Later failures are not announced: each rank
    /// reports the first one.
    fn announce(&self, shared: &Shared, msg: Control, except: Option<Rank>, err: CommError) {
        let mut a = self.announced.lock().unwrap_or_else(|p| p.into_inner());
        if *a || shared.mailbox.failure().is_some() {
            return;
        }
        *a = true;
        self.broadcast(&msg, except);
        shared.fail(err);
    }

    fn is_done(&self, rank: Rank) -> bool {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(rank as usize)
            .copied()
            .unwrap_or(true)
    }
}

/// One rank of a job whose ranks talk over TCP.
pub struct TcpComm {
    shared: Arc<Shared>,
    listen_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for TcpComm {
    /// Stops this rank's connection tasks, after giving queued control
    /// notices (an abort, a death) a moment to reach the other ranks, and
    /// fails what other tasks still wait for on it (a receive made before
    /// the drop would otherwise wait for a message no task reads).
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        let shared = self.shared.clone();
        let senders: Vec<_> = match shared.root_state.get() {
            Some(st) => st.senders.iter().flatten().cloned().collect(),
            None => shared.control.get().cloned().into_iter().collect(),
        };
        let writers = self.all_writers();
        let runtime = shared.runtime.clone();
        drop(runtime.spawn(async move {
            flush_control(senders.iter(), Duration::from_secs(2)).await;
            for w in writers {
                w.close();
            }
            for t in tasks {
                t.abort();
            }
            // (A no-op after a shutdown or an earlier failure.)
            shared
                .mailbox
                .fail(CommError::Shutdown { rank: shared.rank });
        }));
    }
}

/// The root listener a launcher handed rank 0 as descriptor `fd`
/// ([`TcpConfig::root_fd`]), taken at most once per process, and only if
/// it is a TCP socket listening on the root address's port (a descriptor
/// named by mistake, or reused by other code since, is refused, not taken
/// over and closed). Taken, it is made close-on-exec again, so a program
/// that rank 0 starts does not inherit the job's root socket.
#[cfg(unix)]
fn inherited_listener(fd: i32, root: &str) -> Result<TcpListener, CommError> {
    use std::os::fd::FromRawFd;
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let bad = |detail: String| CommError::Bootstrap { rank: 0, detail };
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`; on a
    // descriptor that is not a socket (or not open) it fails instead.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            &mut listening as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(bad(format!(
            "BRAID_ROOT_FD={fd} is not a listening socket ({})",
            std::io::Error::last_os_error()
        )));
    }
    if listening != 1 {
        return Err(bad(format!(
            "BRAID_ROOT_FD={fd} is not a listening socket (a socket, not listening)"
        )));
    }
    // Its address, read through a listener that does not own (or close)
    // the descriptor: a Unix-domain socket has none that std accepts.
    // SAFETY: `fd` is an open socket (checked above); `ManuallyDrop` never
    // closes it.
    let peek = std::mem::ManuallyDrop::new(unsafe { std::net::TcpListener::from_raw_fd(fd) });
    let port = peek
        .local_addr()
        .map_err(|e| bad(format!("BRAID_ROOT_FD={fd} is not a TCP listener ({e})")))?
        .port();
    let want = root
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok());
    if want != Some(port) {
        return Err(bad(format!(
            "BRAID_ROOT_FD={fd} listens on port {port}, not on the root address {root}'s"
        )));
    }
    if TAKEN.swap(true, Ordering::AcqRel) {
        return Err(bad(format!("BRAID_ROOT_FD={fd} was taken already")));
    }
    // SAFETY: fcntl on an open descriptor; it only sets its flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(bad(format!(
            "BRAID_ROOT_FD={fd}: cannot make it close-on-exec ({})",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `fd` is an open TCP listener on the root port (checked
    // above) that the launcher passed to this process for rank 0 alone,
    // taken here once.
    let std_listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    let failed = |e: std::io::Error| bad(format!("the inherited root listener (fd {fd}): {e}"));
    std_listener.set_nonblocking(true).map_err(failed)?;
    TcpListener::from_std(std_listener).map_err(failed)
}

#[cfg(not(unix))]
fn inherited_listener(fd: i32, _root: &str) -> Result<TcpListener, CommError> {
    Err(CommError::Bootstrap {
        rank: 0,
        detail: format!("BRAID_ROOT_FD={fd}: inherited listeners need Unix"),
    })
}

impl TcpComm {
    /// Joins the job described by `config`: rank 0 binds the root address,
    /// the others connect to it. Returns once every rank has registered.
    pub async fn connect(config: TcpConfig) -> Result<TcpComm, CommError> {
        config.check()?;
        let listener = if let (0, Some(fd)) = (config.rank, config.root_fd) {
            inherited_listener(fd, &config.root)?
        } else if config.rank == 0 {
            let mut addr = resolve(&config.root, config.rank).await?;
            // A listen address other than loopback (`BRAID_LISTEN`) is
            // where rank 0 listens too, on the root's port: a root host
            // name may resolve to loopback on its own host (Debian's
            // /etc/hosts maps the host's name to 127.0.1.1), where the
            // other hosts' ranks could not reach it.
            if let Some(ip) = config.listen.filter(|ip| !ip.is_loopback()) {
                addr = SocketAddr::new(ip, addr.port());
            }
            TcpListener::bind(addr)
                .await
                .map_err(|e| CommError::Bootstrap {
                    rank: 0,
                    detail: format!("cannot listen on root address {}: {e}", config.root),
                })?
        } else {
            let ip = match config.listen {
                Some(ip) => ip,
                None => interface_toward(&config.root, config.rank).await?,
            };
            TcpListener::bind(SocketAddr::new(ip, 0))
                .await
                .map_err(|e| CommError::Bootstrap {
                    rank: config.rank,
                    detail: format!("cannot listen on {ip}: {e}"),
                })?
        };
        Self::with_listener(config, listener).await
    }

    /// Like [`TcpComm::connect`] with a listener bound already (for rank 0,
    /// the root address; for the others, their data address).
    pub async fn with_listener(
        config: TcpConfig,
        listener: TcpListener,
    ) -> Result<TcpComm, CommError> {
        if config.nranks == 0 || config.rank >= config.nranks {
            return Err(CommError::Bootstrap {
                rank: config.rank,
                detail: format!("rank {} is not below nranks {}", config.rank, config.nranks),
            });
        }
        // (A configuration made in code, not read from the environment:
        // the same bounds, before anything is allocated per rank.)
        if config.nranks > MAX_RANKS {
            return Err(CommError::Bootstrap {
                rank: config.rank,
                detail: format!(
                    "{} ranks is more than the {MAX_RANKS} a tcp job takes",
                    config.nranks
                ),
            });
        }
        config.check()?;
        let listen_addr = listener.local_addr().map_err(|e| CommError::Bootstrap {
            rank: config.rank,
            detail: format!("cannot read the listener's address: {e}"),
        })?;
        let shared = Arc::new(Shared {
            rank: config.rank,
            nranks: config.nranks,
            token: config.token.clone().into_bytes(),
            root: config.root.clone(),
            timeout: config.timeout,
            max_message: config.max_message_bytes,
            mailbox: Arc::new(Mailbox::new(config.rank)),
            stats: Arc::new(Statistics::new(config.rank, config.nranks)),
            addrs: OnceLock::new(),
            lanes: lanes_for(config.lanes),
            writers: Mutex::new(
                (0..config.nranks as usize * usize::from(MAX_LANES))
                    .map(|_| None)
                    .collect(),
            ),
            stripe_order: (0..config.nranks).map(|_| Mutex::new(())).collect(),
            control_taken: (0..config.nranks).map(|_| AtomicBool::new(false)).collect(),
            start_failed: OnceLock::new(),
            data_accepted: (0..config.nranks as usize * usize::from(MAX_LANES))
                .map(|_| AtomicBool::new(false))
                .collect(),
            readers: (0..config.nranks).map(|_| OnceLock::new()).collect(),
            lanes_in: (0..config.nranks).map(|_| OnceLock::new()).collect(),
            pool: BufferPool::new(RECV_POOL_BYTES),
            control: OnceLock::new(),
            root_state: OnceLock::new(),
            all_done: Event::new(),
            failed: Event::new(),
            shutting_down: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
        });
        let (ctrl_tx, ctrl_rx) = mpsc::unbounded_channel();
        let mut tasks = vec![tokio::spawn(accept_loop(shared.clone(), listener, ctrl_tx))];
        let exits = config
            .exits_fd
            .and_then(crate::rank_exits::watch)
            .map(|(task, rx)| {
                tasks.push(task);
                rx
            });
        let boot = if config.rank == 0 {
            bootstrap_root(shared.clone(), ctrl_rx, exits, &mut tasks).await
        } else {
            bootstrap_peer(shared.clone(), listen_addr, exits, &mut tasks).await
        };
        let comm = TcpComm {
            shared,
            listen_addr,
            tasks,
        };
        boot?;
        Ok(comm)
    }

    /// Starts `nranks` tcp ranks inside this process over loopback (tests
    /// and benchmarks: the same code path as separate processes).
    pub async fn in_process_world(nranks: u32) -> Result<Vec<TcpComm>, CommError> {
        Self::in_process_world_with(nranks, |_| {}).await
    }

    /// [`in_process_world`](Self::in_process_world) with each rank's
    /// config adjusted by `configure` (its lanes, say) before it joins.
    pub async fn in_process_world_with(
        nranks: u32,
        configure: impl Fn(&mut TcpConfig),
    ) -> Result<Vec<TcpComm>, CommError> {
        let root = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| CommError::Bootstrap {
                rank: 0,
                detail: e.to_string(),
            })?;
        let root_addr = root.local_addr().map_err(|e| CommError::Bootstrap {
            rank: 0,
            detail: e.to_string(),
        })?;
        let token = random_token();
        let mut futs = Vec::new();
        let mut root = Some(root);
        for r in 0..nranks {
            let mut cfg = TcpConfig::new(r, nranks, root_addr.to_string(), token.clone());
            configure(&mut cfg);
            let l = root.take();
            futs.push(tokio::spawn(async move {
                match l {
                    Some(l) => TcpComm::with_listener(cfg, l).await,
                    None => TcpComm::connect(cfg).await,
                }
            }));
        }
        let mut out = Vec::new();
        for f in futs {
            out.push(f.await.map_err(|e| CommError::Bootstrap {
                rank: 0,
                detail: e.to_string(),
            })??);
        }
        Ok(out)
    }

    /// The address this rank accepts connections on.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The data connection to `dst` on `lane`, opened on first use.
    fn writer(&self, dst: Rank, lane: u8) -> Arc<PeerWriter> {
        let mut w = self
            .shared
            .writers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let at = dst as usize * usize::from(MAX_LANES) + usize::from(lane);
        if let Some(Some(pw)) = w.get(at) {
            return pw.clone();
        }
        let pw = Arc::new(PeerWriter::new(self.shared.rank, dst));
        self.shared
            .runtime
            .spawn(connection_task(self.shared.clone(), dst, lane, pw.clone()));
        if let Some(slot) = w.get_mut(at) {
            *slot = Some(pw.clone());
        }
        pw
    }

    /// Pieces a `len`-byte message goes in (1: whole).
    fn pieces_for(&self, len: usize) -> u8 {
        let most = (len / STRIPE_PIECE).min(usize::from(self.shared.lanes));
        if most >= 2 { most as u8 } else { 1 }
    }

    /// Queues `data` to `dst` in `k` pieces, piece i on lane i (see the
    /// module doc); what became of each.
    fn send_striped(&self, dst: Rank, tag: Tag, data: Buffer, k: u8) -> Vec<Sent> {
        let len = data.len() as u64;
        let writers: Vec<_> = (0..k).map(|i| self.writer(dst, i)).collect();
        let order = &self.shared.stripe_order[dst as usize];
        let _order = order.lock().unwrap_or_else(|p| p.into_inner());
        let mut sent = Vec::with_capacity(usize::from(k));
        // Lanes 1.. first, to their tasks, which write while this thread
        // writes lane 0's piece.
        for (i, w) in writers.iter().enumerate().skip(1) {
            let (start, size) = stripe_piece(len, k, i as u8);
            let piece = data.slice(start as usize..(start + size) as usize);
            let header = FrameHeader {
                tag,
                len: size,
                pieces: 0,
            };
            sent.push(w.send(header, piece, Write::Task));
        }
        let (_, size0) = stripe_piece(len, k, 0);
        let header = FrameHeader {
            tag,
            len,
            pieces: k,
        };
        sent.push(writers[0].send(header, data.slice(0..size0 as usize), Write::Inline));
        sent
    }

    /// The future of a send whose frames came to `sent`: ready unless one
    /// is queued; the first failure wins.
    fn sent_future(&self, sent: impl IntoIterator<Item = Sent>) -> SendFuture {
        let mut queued = Vec::new();
        for s in sent {
            match s {
                Sent::Done => {}
                Sent::Failed(e) => {
                    let e = self.shared.mailbox.failure().unwrap_or(e);
                    return SendFuture::ready(Err(e));
                }
                Sent::Queued(rx) => queued.push(rx),
            }
        }
        if queued.is_empty() {
            return SendFuture::ready(Ok(()));
        }
        let shared = self.shared.clone();
        SendFuture::waiting(async move {
            for rx in queued {
                rx.await.unwrap_or_else(|_| {
                    Err(shared
                        .mailbox
                        .failure()
                        .unwrap_or(CommError::Shutdown { rank: shared.rank }))
                })?;
            }
            Ok(())
        })
    }

    /// What a receive from `src` reads the socket with while it waits
    /// (`reader`).
    fn drive(&self, src: Rank) -> Arc<dyn super::mailbox::Drive> {
        Arc::new(ReadDrive {
            shared: self.shared.clone(),
            src,
        })
    }

    fn all_writers(&self) -> Vec<Arc<PeerWriter>> {
        self.shared
            .writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// A random token (128 bits from the OS-seeded std hasher).
pub fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut s = String::new();
    for i in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        s.push_str(&format!("{:016x}", h.finish()));
    }
    s
}

/// The address of this host's interface that reaches rank 0 at `root`:
/// loopback where `root` is on loopback; else the source address the
/// routing table picks for it (a UDP socket's `connect` sends nothing).
async fn interface_toward(root: &str, rank: Rank) -> Result<IpAddr, CommError> {
    let to = resolve(root, rank).await?;
    if to.ip().is_loopback() {
        return Ok(match to {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            SocketAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        });
    }
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    std::net::UdpSocket::bind(any)
        .and_then(|u| u.connect(to).and_then(|()| u.local_addr()))
        .map(|a| a.ip())
        .map_err(|e| CommError::Bootstrap {
            rank,
            detail: format!(
                "cannot find this host's interface toward rank 0 at {root} ({to}): {e}; \
                 set BRAID_LISTEN to the address to listen on"
            ),
        })
}

async fn resolve(addr: &str, rank: Rank) -> Result<SocketAddr, CommError> {
    tokio::net::lookup_host(addr)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| CommError::Bootstrap {
            rank,
            detail: format!("cannot resolve address {addr:?}"),
        })
}

/// Connects to `addr`, retrying until `timeout` (the peer may not be up yet),
/// and presents our opening; waits for the ack.
/// Now plus `timeout`, or a year from now where the sum does not fit (a
/// timeout set past what an `Instant` can hold means "no limit" in effect).
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

async fn open(
    shared: &Shared,
    addr: &str,
    kind: ConnKind,
    peer: Rank,
) -> Result<TcpStream, CommError> {
    let deadline = deadline_after(shared.timeout);
    let mut last_err = String::new();
    loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(CommError::Timeout {
                rank: shared.rank,
                what: format!("a connection to rank {peer} at {addr} ({last_err})"),
                secs: shared.timeout.as_secs(),
            });
        }
        // Bounded by the deadline: a silently dropped SYN would otherwise
        // hold this attempt for the OS's connect timeout (minutes).
        let attempt = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(r) => r,
            Err(_) => {
                last_err = "no answer".into();
                continue;
            }
        };
        match attempt {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                watch_host(&s);
                let hello = Hello {
                    kind,
                    token: shared.token.clone(),
                    rank: shared.rank,
                    nranks: shared.nranks,
                };
                let io = |e: std::io::Error| CommError::Io {
                    rank: shared.rank,
                    peer: Some(peer),
                    detail: e.to_string(),
                };
                tokio::time::timeout(HANDSHAKE_TIMEOUT, s.write_all(&hello.encode()))
                    .await
                    .map_err(|_| CommError::Io {
                        rank: shared.rank,
                        peer: Some(peer),
                        detail: "the opening was not taken within the handshake time".into(),
                    })?
                    .map_err(io)?;
                // A refusal (the peer said why) is a `Protocol` error, and
                // final; no answer (the peer gone, or no braid rank) is `Io`.
                let answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, Answer::read(&mut s)).await;
                let none = match answer {
                    Ok(Ok(Answer::Accepted)) => return Ok(s),
                    Ok(Ok(Answer::Refused(why))) => {
                        return Err(CommError::Protocol {
                            rank: shared.rank,
                            peer: Some(peer),
                            detail: format!("rank {peer} at {addr} refused our connection: {why}"),
                        });
                    }
                    Ok(Err(e)) => format!("an answer no braid rank gives ({e})"),
                    Err(_) => "no answer within the handshake time".into(),
                };
                return Err(CommError::Io {
                    rank: shared.rank,
                    peer: Some(peer),
                    detail: format!("rank {peer} at {addr} took our connection but gave {none}"),
                });
            }
            Err(e) => {
                last_err = e.to_string();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Keepalive probes on an idle connection: a peer whose host went away
/// (powered off, cut off the network) sends no close, and the rank waiting
/// on its control connection (rank 0 for every rank, every rank for rank
/// 0) would wait for ever. After `KEEPALIVE_IDLE` of silence the kernel
/// probes every `KEEPALIVE_INTERVAL`, and after `KEEPALIVE_PROBES`
/// unanswered ones the connection fails, which fails the job (about a
/// minute). A process that died on a living host is seen at once (its
/// kernel closes the connection); a stopped one (SIGSTOP) is not (its
/// kernel answers the probes).
fn watch_host(s: &TcpStream) {
    let ka = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    let ka = ka
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(s).set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "no keepalive on a connection");
    }
}

/// Silence on a connection before its first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Between keepalive probes.
#[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the connection fails.
#[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
const KEEPALIVE_PROBES: u32 = 3;

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    ctrl: mpsc::UnboundedSender<Joining>,
) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(rank = shared.rank, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = shared.clone();
        let ctrl = ctrl.clone();
        tokio::spawn(async move {
            if let Err(e) = handshake(&shared, stream, &ctrl).await {
                shared.stats.record_rejected_connection();
                let err = CommError::Protocol {
                    rank: shared.rank,
                    peer: None,
                    detail: format!("refused connection from {from}: {e}"),
                };
                tracing::warn!("{err}");
            }
        });
    }
}

/// What reaches rank 0's bootstrap from its accepted connections.
enum Joining {
    /// Rank `.0` opened its control connection.
    Rank(Rank, TcpStream),
    /// A rank of this job (its token) disagrees on the job's size: the
    /// job cannot start, and every rank is told why.
    Misfit(Rank, String, TcpStream),
}

/// Why an opening was not taken.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// Not a braid rank's opening (or cut short): dropped unanswered.
    #[error("{0}")]
    Unread(WireError),
    /// A braid rank's opening this rank does not take; the opener was told.
    #[error("{0}")]
    Told(String),
}

/// Tells the opener why its connection is refused (bounded: an opener that
/// does not read is not waited for), and returns the refusal.
async fn refuse(stream: &mut TcpStream, reason: String) -> Refusal {
    let answer = Answer::Refused(reason.clone()).encode();
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.write_all(&answer)).await;
    Refusal::Told(reason)
}

async fn handshake(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    ctrl: &mpsc::UnboundedSender<Joining>,
) -> Result<(), Refusal> {
    let hello = match tokio::time::timeout(HANDSHAKE_TIMEOUT, Hello::read(&mut stream)).await {
        Err(_) => {
            return Err(Refusal::Unread(WireError::Io(
                "no opening within the handshake time".into(),
            )));
        }
        Ok(Err(e)) => return Err(Refusal::Unread(e)),
        Ok(Ok(h)) => h,
    };
    let (me, n, r) = (shared.rank, shared.nranks, hello.rank);
    if !constant_time_eq(&hello.token, &shared.token) {
        let reason = format!(
            "rank {me}'s job token is another (a process of another job, or BRAID_TOKEN differs between ranks)"
        );
        return Err(refuse(&mut stream, reason).await);
    }
    if hello.nranks != n {
        let reason = format!(
            "rank {r} says the job has {} ranks, rank {me} that it has {n} (BRAID_NRANKS differs between ranks)",
            hello.nranks
        );
        // A rank of this very job that cannot fit in it: the job cannot
        // start, and rank 0 fails it at once, naming it, rather than wait
        // out its timeout for a rank that never comes. Rank 0's start-up
        // tells the rank why before it fails (its failure ends the
        // process, and with it this task).
        if hello.kind == ConnKind::Control && me == 0 && shared.root_state.get().is_none() {
            match ctrl.send(Joining::Misfit(r, reason.clone(), stream)) {
                Ok(()) => return Err(Refusal::Told(reason)),
                Err(mpsc::error::SendError(Joining::Misfit(_, _, s))) => stream = s,
                Err(_) => return Err(Refusal::Told(reason)),
            }
        }
        return Err(refuse(&mut stream, reason).await);
    }
    if r >= n {
        let reason = format!("rank {r} is past the job's {n} ranks");
        return Err(refuse(&mut stream, reason).await);
    }
    if r == me {
        let reason =
            format!("two processes run as rank {r} (this one, and the one that connected)");
        return Err(refuse(&mut stream, reason).await);
    }
    let _ = stream.set_nodelay(true);
    watch_host(&stream);
    let accepted = Answer::Accepted.encode();
    match hello.kind {
        ConnKind::Data { lane } => {
            let at = r as usize * usize::from(MAX_LANES) + usize::from(lane);
            let first = shared
                .data_accepted
                .get(at)
                .is_some_and(|a| !a.swap(true, Ordering::AcqRel));
            if !first {
                let reason = format!("a second data connection from rank {r} on lane {lane}");
                return Err(refuse(&mut stream, reason).await);
            }
            let Some(lanes) = shared
                .lanes_in
                .get(r as usize)
                .map(|l| l.get_or_init(|| Arc::new(Lanes::new())).clone())
            else {
                return Err(refuse(&mut stream, format!("no lanes for rank {r}")).await);
            };
            stream
                .write_all(&accepted)
                .await
                .map_err(|e| Refusal::Unread(e.into()))?;
            let reader = Arc::new(PeerReader::new(r, lane, lanes, stream));
            if lane == 0 {
                if let Some(slot) = shared.readers.get(r as usize) {
                    let _ = slot.set(reader.clone());
                }
            }
            tokio::spawn(reader_task(shared.clone(), reader));
        }
        ConnKind::Control => {
            if me != 0 {
                let reason = format!(
                    "rank {me} is not rank 0: a rank's control connection goes to rank 0 (BRAID_ROOT)"
                );
                return Err(refuse(&mut stream, reason).await);
            }
            if shared.root_state.get().is_some() {
                let reason = format!(
                    "the job's {n} ranks have all joined and it has started: is a second process running as rank {r}?"
                );
                return Err(refuse(&mut stream, reason).await);
            }
            if let Some(detail) = shared.start_failed.get() {
                // Taken, and told as the ranks that had joined were (an
                // Abort: it only passes rank 0's verdict on).
                let abort = Control::Abort {
                    origin: 0,
                    reason: format!("bootstrap failed: {detail}"),
                };
                let told = async {
                    if stream.write_all(&accepted).await.is_ok() {
                        tell_and_close(&mut stream, &abort).await;
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), told).await;
                return Err(Refusal::Told(format!(
                    "rank 0's start-up had failed: {detail}"
                )));
            }
            let taken = shared
                .control_taken
                .get(r as usize)
                .is_some_and(|t| t.swap(true, Ordering::AcqRel));
            if taken {
                let reason = format!(
                    "another process has already joined as rank {r}: give each process a rank of its own"
                );
                return Err(refuse(&mut stream, reason).await);
            }
            stream
                .write_all(&accepted)
                .await
                .map_err(|e| Refusal::Unread(e.into()))?;
            ctrl.send(Joining::Rank(r, stream))
                .map_err(|_| Refusal::Unread(WireError::Io("bootstrap is over".into())))?;
        }
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long a data connection's error waits for the control plane to
/// explain it (a peer's death) before it fails the job itself.
const DATA_ERROR_GRACE: Duration = Duration::from_secs(2);

/// A data connection from `src` that failed: a peer that died is reported
/// by the control plane (naming it to every rank), so the job is failed
/// here (with `detail`) only if nothing explains it within the grace
/// period and the rank is not shutting down.
async fn connection_lost(shared: &Shared, src: Rank, detail: String) {
    tokio::time::sleep(DATA_ERROR_GRACE).await;
    if !shared.shutting_down.load(Ordering::Relaxed) && shared.mailbox.failure().is_none() {
        shared.fail_seen(CommError::PeerDied {
            rank: shared.rank,
            peer: src,
            detail,
        });
    }
}

/// Lanes a rank uses: as configured, else one a worker thread of its
/// runtime, at least 2 and at most [`DEFAULT_LANES`]. Two lanes on one
/// worker still gain (two sockets' buffers in flight, the peer's reader
/// threads): 2-core VM, 2 rank processes of one worker each, 1 MiB
/// SendRecv 511 and 438 us on 2 lanes against 758 and 626 on 1.
fn lanes_for(configured: Option<u8>) -> u8 {
    let lanes = configured.unwrap_or_else(|| {
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1);
        workers.clamp(2, usize::from(DEFAULT_LANES)) as u8
    });
    lanes.clamp(1, MAX_LANES)
}

/// Opens the data connection to `dst` on `lane` and writes `pw`'s frames
/// to it.
async fn connection_task(shared: Arc<Shared>, dst: Rank, lane: u8, pw: Arc<PeerWriter>) {
    let addr = if dst == 0 {
        shared.root.clone()
    } else {
        match shared.addrs.get().and_then(|a| a.get(dst as usize)) {
            Some(a) => a.clone(),
            None => {
                pw.fail(shared.bootstrap_err(format!("no address for rank {dst}")));
                return;
            }
        }
    };
    // Once this rank has failed, nothing more goes out: waiting on a
    // connection (a peer that already left stops listening) or on a peer
    // that stopped reading would hold the sender until the connect timeout.
    let failed = || async {
        shared.failed.wait().await;
        shared
            .mailbox
            .failure()
            .unwrap_or(CommError::Shutdown { rank: shared.rank })
    };
    let opened = tokio::select! {
        r = open(&shared, &addr, ConnKind::Data { lane }, dst) => r,
        e = failed() => {
            pw.fail(e);
            return;
        }
    };
    let stream = match opened {
        Ok(s) => s,
        Err(e) => {
            let e = root_cause(&shared, e).await;
            shared.fail_seen(e.clone());
            pw.fail(e);
            return;
        }
    };
    let ran = tokio::select! {
        r = pw.clone().run(stream) => r,
        e = failed() => {
            pw.fail(e);
            return;
        }
    };
    if let Err(e) = ran {
        let err = CommError::PeerDied {
            rank: shared.rank,
            peer: dst,
            detail: format!("write failed: {e}"),
        };
        let err = root_cause(&shared, err).await;
        pw.fail(err.clone());
        shared.fail_seen(err);
    }
}

/// A broken data connection is usually the effect of a failure that the
/// control plane is about to report (a peer aborted, a process died): give
/// that report a moment to arrive and prefer it, since it names the cause.
async fn root_cause(shared: &Shared, seen: CommError) -> CommError {
    if shared.mailbox.failure().is_none() {
        let _ = tokio::time::timeout(Duration::from_secs(2), shared.failed.wait()).await;
    }
    shared.mailbox.failure().unwrap_or(seen)
}

/// Rank 0: waits for every rank's registration, sends the table, then runs
/// the control plane.
async fn bootstrap_root(
    shared: Arc<Shared>,
    mut ctrl_rx: mpsc::UnboundedReceiver<Joining>,
    mut exits: Option<mpsc::UnboundedReceiver<Ended>>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(), CommError> {
    let n = shared.nranks as usize;
    let mut conns: Vec<Option<(TcpStream, String)>> = (0..n).map(|_| None).collect();
    let mut missing = n - 1;
    let mut unreachable = None;
    let deadline = deadline_after(shared.timeout);
    while missing > 0 {
        let next = tokio::select! {
            next = tokio::time::timeout_at(deadline, ctrl_rx.recv()) => next,
            e = next_exit(&mut exits) => {
                // A rank that has ended before the job started (joined or
                // not) will never take part in it.
                let Some(e) = e.filter(|e| e.rank != 0 && e.rank < shared.nranks) else {
                    continue;
                };
                let when = if conns[e.rank as usize].is_some() {
                    "after it joined, before the job started"
                } else {
                    "before it joined the job"
                };
                let detail = format!(
                    "rank {} ended {when} ({}; seen by the launcher)",
                    e.rank, e.status
                );
                abort_bootstrap(&shared, &mut conns, &mut ctrl_rx, &detail).await;
                return Err(if e.ok {
                    // (It did not fail: the start-up did, here.)
                    shared.bootstrap_err(detail)
                } else {
                    // (Its own failure is the cause; this rank passes it on.)
                    CommError::PeerDied { rank: 0, peer: e.rank, detail }
                });
            }
        };
        let (r, mut s) = match next {
            Ok(Some(Joining::Rank(r, s))) => (r, s),
            Ok(Some(Joining::Misfit(peer, detail, mut s))) => {
                refuse(&mut s, detail.clone()).await;
                abort_bootstrap(&shared, &mut conns, &mut ctrl_rx, &detail).await;
                // (The misfit's own error is the cause: it was refused.)
                return Err(CommError::PeerMisfit {
                    rank: 0,
                    peer,
                    detail,
                });
            }
            Ok(None) => {
                let detail = "rank 0's listener stopped";
                abort_bootstrap(&shared, &mut conns, &mut ctrl_rx, detail).await;
                return Err(shared.bootstrap_err(detail));
            }
            Err(_) => {
                let absent: Vec<String> = (1..n)
                    .filter(|r| conns[*r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                let detail = format!(
                    "rank(s) {} did not join within {} s (the process ended, or never set up its communicator)",
                    absent.join(", "),
                    shared.timeout.as_secs()
                );
                abort_bootstrap(&shared, &mut conns, &mut ctrl_rx, &detail).await;
                return Err(shared.bootstrap_err(detail));
            }
        };
        let reg = tokio::time::timeout(HANDSHAKE_TIMEOUT, Control::read(&mut s)).await;
        let addr = match reg {
            Ok(Ok(Some(Control::Register(a)))) => a,
            _ => {
                tracing::warn!(rank = 0, peer = r, "rank sent no registration; dropped");
                continue;
            }
        };
        if let (None, Some(from)) = (&unreachable, loopback_from_another_host(&s, &addr)) {
            unreachable = Some(format!(
                "rank {r} listens on {addr}, a loopback address, on another host than rank 0 \
                 (it connected from {from}): ranks on other hosts cannot reach it; unset \
                 BRAID_LISTEN for it (it then listens toward rank 0) or set it to an address \
                 of its host"
            ));
        }
        conns[r as usize] = Some((s, addr));
        missing -= 1;
    }
    // (Told once every rank has joined, so that each fails with the cause.)
    if let Some(detail) = unreachable {
        abort_bootstrap(&shared, &mut conns, &mut ctrl_rx, &detail).await;
        return Err(shared.bootstrap_err(detail));
    }
    let table: Vec<String> = conns
        .iter()
        .map(|c| c.as_ref().map(|(_, a)| a.clone()).unwrap_or_default())
        .collect();
    let encoded_table = Arc::new(Control::Table(table.clone()).encode());
    let _ = shared.addrs.set(table);
    let mut senders = vec![None];
    let mut halves = Vec::new();
    let mut receivers = Vec::new();
    for (r, c) in conns.into_iter().enumerate().skip(1) {
        let Some((s, _)) = c else { continue };
        let (rd, wr) = s.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(CtrlItem::Encoded(encoded_table.clone()));
        senders.push(Some(tx));
        receivers.push((wr, rx));
        halves.push((r as Rank, rd));
    }
    let state = Arc::new(RootState {
        senders,
        done: Mutex::new(vec![false; n]),
        all_done: shared.all_done.clone(),
        announced: Mutex::new(false),
    });
    let _ = shared.root_state.set(state.clone());
    for (wr, rx) in receivers {
        tasks.push(tokio::spawn(control_writer(wr, rx)));
    }
    for (r, rd) in halves {
        tasks.push(tokio::spawn(root_control_reader(
            shared.clone(),
            state.clone(),
            r,
            rd,
        )));
    }
    Ok(())
}

/// The next exit notice, where there are any; `None` once they end (or
/// where there are none), after which it is not asked again.
async fn next_exit(exits: &mut Option<mpsc::UnboundedReceiver<Ended>>) -> Option<Ended> {
    let e = match exits.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    };
    if e.is_none() {
        *exits = None;
    }
    e
}

/// The exit notice of rank 0 (pending for ever where none comes).
async fn rank0_exit(exits: &mut Option<mpsc::UnboundedReceiver<Ended>>) -> Ended {
    loop {
        match next_exit(exits).await {
            Some(e) if e.rank == 0 => return e,
            Some(_) => {}
            None => std::future::pending::<()>().await,
        }
    }
}

/// Where a rank registers a loopback address over a control connection
/// from another host (neither loopback nor rank 0's own address of that
/// connection), the address it connected from: no rank of another host
/// could reach its listener.
fn loopback_from_another_host(control: &TcpStream, advertised: &str) -> Option<IpAddr> {
    let ip = advertised.parse::<SocketAddr>().ok()?.ip();
    let from = control.peer_addr().ok()?.ip();
    let here = control.local_addr().ok()?.ip();
    (ip.is_loopback() && !from.is_loopback() && from != here).then_some(from)
}

/// Rank 0's bootstrap failed: tells each rank that registered why
/// (`Abort`), so that its error names the cause (a rank that never joined)
/// instead of a closed connection, and it exits as one that only heard of
/// another's failure. The ranks whose connections were taken but not yet
/// read (queued behind the failure) are told too. Bounded: a rank that
/// does not read is not waited for.
async fn abort_bootstrap(
    shared: &Shared,
    conns: &mut [Option<(TcpStream, String)>],
    queued: &mut mpsc::UnboundedReceiver<Joining>,
    detail: &str,
) {
    let msg = Control::Abort {
        origin: 0,
        reason: format!("bootstrap failed: {detail}"),
    };
    let _ = shared.start_failed.set(detail.to_string());
    queued.close();
    let mut late = Vec::new();
    while let Ok(j) = queued.try_recv() {
        match j {
            Joining::Rank(_, s) => late.push(s),
            Joining::Misfit(_, why, mut s) => {
                refuse(&mut s, why).await;
            }
        }
    }
    let writes = conns
        .iter_mut()
        .filter_map(|c| c.as_mut())
        .map(|(s, _)| s)
        .chain(late.iter_mut())
        .map(|s| tell_and_close(s, &msg));
    let _ = tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(writes)).await;
}

/// Writes `msg` and closes the connection once the peer has: bytes left
/// unread at a close (a registration not yet read) make it a reset, and a
/// reset can drop the message before the peer reads it.
async fn tell_and_close(s: &mut TcpStream, msg: &Control) {
    use tokio::io::AsyncReadExt;
    if msg.write(s).await.is_err() {
        return;
    }
    let _ = s.shutdown().await;
    let mut sink = [0u8; 512];
    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// Writes control messages in order and answers flush requests.
async fn control_writer(
    mut w: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<CtrlItem>,
) {
    let mut broken = false;
    while let Some(item) = rx.recv().await {
        match item {
            CtrlItem::Msg(m) if !broken => broken = m.write(&mut w).await.is_err(),
            CtrlItem::Encoded(b) if !broken => {
                use tokio::io::AsyncWriteExt as _;
                broken = w.write_all(&b).await.is_err() || w.flush().await.is_err();
            }
            CtrlItem::Msg(_) | CtrlItem::Encoded(_) => {}
            CtrlItem::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Rank 0's reader of rank `peer`'s control connection.
async fn root_control_reader(
    shared: Arc<Shared>,
    state: Arc<RootState>,
    peer: Rank,
    mut rd: tokio::net::tcp::OwnedReadHalf,
) {
    loop {
        match Control::read(&mut rd).await {
            Ok(Some(Control::Done { sent })) => {
                // Tell every other rank how many messages to expect from
                // `peer` (rank 0 itself included) before marking it done.
                if sent.len() == shared.nranks as usize {
                    for (q, count) in sent.iter().enumerate() {
                        if q == peer as usize {
                            continue;
                        }
                        if q == 0 {
                            shared.mailbox.peer_finished(peer, Some(*count));
                        } else if let Some(Some(s)) = state.senders.get(q) {
                            let _ = s.send(CtrlItem::Msg(Control::Finished { peer, sent: *count }));
                        }
                    }
                } else {
                    tracing::warn!(
                        rank = 0,
                        peer,
                        "Done with {} message counts for {} ranks",
                        sent.len(),
                        shared.nranks
                    );
                }
                state.mark_done(peer)
            }
            Ok(Some(Control::Abort { reason, .. })) => {
                // First failure wins: a rank that aborts because it saw an
                // earlier failure adds nothing.
                let err = CommError::Aborted {
                    rank: 0,
                    peer,
                    reason: reason.clone(),
                };
                state.announce(
                    &shared,
                    Control::Abort {
                        origin: peer,
                        reason,
                    },
                    Some(peer),
                    err,
                );
            }
            Ok(Some(other)) => {
                tracing::warn!(rank = 0, peer, "unexpected control message {other:?}");
            }
            end @ (Ok(None) | Err(_)) => {
                if !state.is_done(peer) {
                    let detail = control_lost(
                        "its process exited or its connection to rank 0 broke",
                        end.err(),
                    );
                    let err = CommError::PeerDied {
                        rank: 0,
                        peer,
                        detail: detail.clone(),
                    };
                    state.announce(&shared, Control::Died { peer, detail }, Some(peer), err);
                }
                return;
            }
        }
    }
}

/// How much longer than the bootstrap timeout a rank other than 0 waits
/// for rank 0's address table (or its Abort naming the missing ranks).
const TABLE_GRACE: Duration = Duration::from_secs(2);

/// A rank other than 0: registers with rank 0 and waits for the table.
async fn bootstrap_peer(
    shared: Arc<Shared>,
    listen_addr: SocketAddr,
    mut exits: Option<mpsc::UnboundedReceiver<Ended>>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(), CommError> {
    // A rank 0 that has ended will not answer: connecting stops at its
    // exit notice. Once connected, its end closes the connection after
    // whatever it said (an Abort or a refusal, whose reason is the best
    // one and final), or resets a connection the kernel took for it
    // before it ended: a notice that comes soon after such a failure says
    // why better than the reset. A rank 0 that ended with success did not
    // fail: the start-up fails here, as rank 0's does for a rank that
    // ended before it joined.
    let rank0_ended = |e: Ended| {
        let detail = format!(
            "rank 0 ended before this rank could join the job ({}; seen by the launcher)",
            e.status
        );
        if e.ok {
            shared.bootstrap_err(detail)
        } else {
            CommError::PeerDied {
                rank: shared.rank,
                peer: 0,
                detail,
            }
        }
    };
    let opened = tokio::select! {
        // (An answer already here is read before a notice: a refusal
        // written before rank 0 ended is the reason.)
        biased;
        s = open(&shared, &shared.root, ConnKind::Control, 0) => s,
        e = rank0_exit(&mut exits) => return Err(rank0_ended(e)),
    };
    let joined = match opened {
        Ok(mut s) => register(&shared, &mut s, listen_addr).await.map(|t| (s, t)),
        Err(e) => Err(e),
    };
    let (s, table) = match joined {
        Ok(x) => x,
        Err(err @ (CommError::Aborted { .. } | CommError::Protocol { .. })) => return Err(err),
        Err(err) if exits.is_none() => return Err(err),
        Err(err) => {
            let told = tokio::time::timeout(Duration::from_secs(1), rank0_exit(&mut exits)).await;
            return Err(told.map_or(err, rank0_ended));
        }
    };
    let _ = shared.addrs.set(table);
    let (rd, wr) = s.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = shared.control.set(tx);
    tasks.push(tokio::spawn(control_writer(wr, rx)));
    tasks.push(tokio::spawn(peer_control_reader(shared, rd)));
    Ok(())
}

/// Registers this rank's data address with rank 0 over its control
/// connection `s` and waits for the address table.
async fn register(
    shared: &Shared,
    s: &mut TcpStream,
    listen_addr: SocketAddr,
) -> Result<Vec<String>, CommError> {
    // Advertise an address peers can reach: the bound IP, or, when bound
    // to all interfaces, the interface that reaches rank 0.
    let listen_ip = listen_addr.ip();
    let ip = if listen_ip.is_unspecified() {
        s.local_addr().map(|a| a.ip()).unwrap_or(listen_ip)
    } else {
        listen_ip
    };
    let advertised = SocketAddr::new(ip, listen_addr.port()).to_string();
    Control::Register(advertised)
        .write(s)
        .await
        .map_err(|e| shared.bootstrap_err(format!("registering with rank 0: {e}")))?;
    // Rank 0 gives up at its own timeout and says which ranks did not
    // join (an Abort): waited for a little longer here, so that its
    // verdict, not this rank's own timeout, is what this rank reports.
    let wait = shared.timeout.saturating_add(TABLE_GRACE);
    match tokio::time::timeout(wait, Control::read(s)).await {
        Ok(Ok(Some(Control::Table(t)))) if t.len() == shared.nranks as usize => Ok(t),
        Ok(Ok(Some(Control::Abort { origin, reason }))) => Err(CommError::Aborted {
            rank: shared.rank,
            peer: origin,
            reason,
        }),
        // Rank 0 ended (or dropped this rank) before the table: its own
        // error says why; this rank only passes that on.
        Ok(Ok(None)) => Err(CommError::PeerDied {
            rank: shared.rank,
            peer: 0,
            detail: "rank 0 closed its connection during bootstrap, before sending the address table (it failed or exited; its own error says why)".into(),
        }),
        Ok(Ok(Some(other))) => Err(shared.bootstrap_err(format!(
            "expected the address table from rank 0, got {other:?}"
        ))),
        Ok(Err(e)) => Err(shared.bootstrap_err(format!("reading the address table: {e}"))),
        Err(_) => Err(shared.bootstrap_err(format!(
            "timed out after {} s waiting for the other ranks to join",
            wait.as_secs()
        ))),
    }
}

async fn peer_control_reader(shared: Arc<Shared>, mut rd: tokio::net::tcp::OwnedReadHalf) {
    loop {
        match Control::read(&mut rd).await {
            Ok(Some(Control::AllDone)) => shared.all_done.set(),
            Ok(Some(Control::Finished { peer, sent })) => {
                shared.mailbox.peer_finished(peer, Some(sent))
            }
            Ok(Some(Control::Died { peer, detail })) => shared.fail(CommError::PeerDied {
                rank: shared.rank,
                peer,
                detail,
            }),
            Ok(Some(Control::Abort { origin, reason })) => shared.fail(CommError::Aborted {
                rank: shared.rank,
                peer: origin,
                reason,
            }),
            Ok(Some(other)) => {
                tracing::warn!(rank = shared.rank, "unexpected control message {other:?}");
            }
            end @ (Ok(None) | Err(_)) => {
                if !shared.all_done.is_set() {
                    shared.fail(CommError::PeerDied {
                        rank: shared.rank,
                        peer: 0,
                        detail: control_lost("lost the control connection to rank 0", end.err()),
                    });
                }
                return;
            }
        }
    }
}

/// What ended a control connection, for its error: a read that failed
/// says why, and a malformed or oversized message is named as such (it
/// was reported as the peer's death alone).
fn control_lost(ended: &str, err: Option<WireError>) -> String {
    match err {
        None => ended.to_string(),
        Some(WireError::Io(e)) => format!("{ended}: {e}"),
        Some(e) => {
            format!("its control message could not be read ({e}); the connection is dropped")
        }
    }
}

impl Communicator for TcpComm {
    fn rank(&self) -> Rank {
        self.shared.rank
    }

    fn nranks(&self) -> u32 {
        self.shared.nranks
    }

    fn backend(&self) -> Backend {
        Backend::Tcp
    }

    fn max_message(&self) -> u64 {
        self.shared.max_message
    }

    fn send(&self, dst: Rank, tag: Tag, data: Buffer) -> SendFuture {
        if let Err(e) = check_rank(self.shared.rank, dst, self.shared.nranks) {
            return SendFuture::ready(Err(e));
        }
        if let Some(e) = self.shared.mailbox.failure() {
            return SendFuture::ready(Err(e));
        }
        if self.shared.mailbox.is_closed() {
            return SendFuture::ready(Err(self.shared.mailbox.shutdown_error()));
        }
        if dst == self.shared.rank {
            self.shared.stats.record_send(dst, data.len());
            self.shared.stats.record_recv(dst, data.len());
            self.shared.mailbox.deliver(dst, tag, data);
            return SendFuture::ready(Ok(()));
        }
        // The receiver refuses a frame over the limit (and fails the job):
        // say so here, at the sender, naming the message. (A message to
        // this rank itself is no frame and has no limit.)
        if data.len() as u64 > self.shared.max_message {
            return SendFuture::ready(Err(CommError::MessageTooLarge {
                rank: self.shared.rank,
                peer: dst,
                size: data.len() as u64,
                limit: self.shared.max_message,
                backend: "tcp",
            }));
        }
        self.shared.stats.record_send(dst, data.len());
        let k = self.pieces_for(data.len());
        if k >= 2 {
            let sent = self.send_striped(dst, tag, data, k);
            return self.sent_future(sent);
        }
        // One frame (the small-message path): no vector of outcomes.
        let header = FrameHeader {
            tag,
            len: data.len() as u64,
            pieces: 0,
        };
        let sent = self.writer(dst, 0).send(header, data, Write::Inline);
        self.sent_future(std::iter::once(sent))
    }

    fn recv(&self, src: Rank, tag: Tag) -> RecvFuture {
        if let Err(e) = check_rank(self.shared.rank, src, self.shared.nranks) {
            return RecvFuture::ready(Err(e));
        }
        self.shared
            .mailbox
            .recv(src, tag)
            .driven_by(self.drive(src))
    }

    fn recv_landing(&self, src: Rank, tag: Tag, landing: Landing) -> RecvFuture {
        if let Err(e) = check_rank(self.shared.rank, src, self.shared.nranks) {
            return RecvFuture::ready(Err(e));
        }
        self.shared
            .mailbox
            .recv_landing(src, tag, landing)
            .driven_by(self.drive(src))
    }

    fn abort(&self, reason: &str) {
        let s = &self.shared;
        if s.mailbox.failure().is_some() {
            // Already failed: that failure is what every rank hears.
            return;
        }
        let err = CommError::Aborted {
            rank: s.rank,
            peer: s.rank,
            reason: reason.to_string(),
        };
        s.fail_and_tell(reason.to_string(), err);
    }

    fn failure(&self) -> Option<CommError> {
        self.shared.mailbox.failure()
    }

    fn shutdown(&self) -> BoxFuture<'static, Result<(), CommError>> {
        let shared = self.shared.clone();
        let writers = self.all_writers();
        shared.mailbox.close();
        Box::pin(async move {
            if shared.failed.is_set() {
                // Failing: make sure our notices (Abort, Died) reach the
                // other ranks before this process goes away.
                let root_state = shared.root_state.get().cloned();
                let senders: Vec<_> = match &root_state {
                    Some(st) => st.senders.iter().flatten().cloned().collect(),
                    None => shared.control.get().cloned().into_iter().collect(),
                };
                flush_control(senders.iter(), Duration::from_secs(5)).await;
                return Err(shared
                    .mailbox
                    .failure()
                    .unwrap_or(CommError::Shutdown { rank: shared.rank }));
            }
            for w in writers {
                if let Ok(Err(e)) = w.flush().await {
                    return Err(shared.mailbox.failure().unwrap_or(e));
                }
            }
            shared.shutting_down.store(true, Ordering::Relaxed);
            // Messages sent to each rank: a rank still waiting for one from
            // here beyond these learns that it never comes.
            let sent: Vec<u64> = (0..shared.nranks)
                .map(|q| shared.stats.peer(q).msgs_sent)
                .collect();
            let root_state = shared.root_state.get().cloned();
            if let Some(state) = &root_state {
                for (q, s) in state.senders.iter().enumerate() {
                    if let (Some(s), Some(count)) = (s, sent.get(q)) {
                        let _ = s.send(CtrlItem::Msg(Control::Finished {
                            peer: 0,
                            sent: *count,
                        }));
                    }
                }
                state.mark_done(0);
            } else if shared.nranks == 1 {
                shared.all_done.set();
            } else if let Some(c) = shared.control.get() {
                let _ = c.send(CtrlItem::Msg(Control::Done { sent }));
            }
            tokio::select! {
                _ = shared.all_done.wait() => {}
                _ = shared.failed.wait() => {}
            }
            if let Some(state) = &root_state {
                // Rank 0 leaves only once every notice (AllDone, or a
                // failure) is written.
                flush_control(state.senders.iter().flatten(), shared.timeout).await;
            }
            match shared.mailbox.failure() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
    }

    fn statistics(&self) -> &Arc<Statistics> {
        &self.shared.stats
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::tag::OpId;
    use std::os::fd::{AsRawFd, IntoRawFd};

    /// A runtime of two workers, timers and sockets on.
    fn two_workers() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"))
    }

    /// A loopback port free a moment ago.
    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A root address without a port, or a token longer than a handshake
    /// carries, fails every rank at once (they retried for the whole
    /// timeout before, or were refused at the handshake).
    #[test]
    fn configs_that_cannot_join_are_refused_before_trying() {
        let c = |root: &str, token_len: usize| {
            TcpConfig::new(1, 2, root, "t".repeat(token_len)).check()
        };
        assert!(c("127.0.0.1:4000", 16).is_ok());
        assert!(c("[::1]:4000", 16).is_ok());
        assert!(c("host.example:1", wire::MAX_TOKEN_LEN).is_ok());
        for root in ["127.0.0.1", "host:", ":4000", "host:99999", "host:port"] {
            let e = c(root, 16).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                e.contains("is not host:port") && e.contains("rank 1"),
                "{root}: {e}"
            );
        }
        let e = c("h:1", wire::MAX_TOKEN_LEN + 1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("1025 bytes"), "{e}");
        // Rank 0 is refused as early, in `connect`.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let r = rt.block_on(TcpComm::connect(TcpConfig::new(0, 2, "127.0.0.1", "t")));
        assert!(
            r.err()
                .is_some_and(|e| e.to_string().contains("not host:port"))
        );
    }

    /// Rank 0 with a listen address other than loopback listens there, on
    /// the root's port: a rank that reaches the host by another address
    /// (here 127.0.0.2, where rank 0's root says 127.0.0.1, as a host
    /// name that resolves to loopback on its own host would) joins. Before,
    /// rank 0 bound the root's address only and the rank timed out.
    #[cfg(target_os = "linux")]
    #[test]
    fn rank_0_listens_where_braid_listen_says() {
        let rt = two_workers();
        rt.block_on(async {
            let port = free_port();
            let mut c0 = TcpConfig::new(0, 2, format!("127.0.0.1:{port}"), "tok");
            c0.listen = Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            c0.timeout = Duration::from_secs(5);
            let mut c1 = TcpConfig::new(1, 2, format!("127.0.0.2:{port}"), "tok");
            c1.timeout = Duration::from_secs(5);
            let (a, b) = tokio::join!(TcpComm::connect(c0), TcpComm::connect(c1));
            let (a, b) = (
                a.unwrap_or_else(|e| panic!("rank 0: {e}")),
                b.unwrap_or_else(|e| panic!("rank 1: {e}")),
            );
            let tag = Tag::new(OpId(1), 0);
            a.send(1, tag, crate::Buffer::from_vec(vec![7u8; 3]))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let got = b.recv(0, tag).await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got.as_slice(), [7, 7, 7]);
            let _ = tokio::join!(a.shutdown(), b.shutdown());
        });
    }

    /// A second process joining as a rank already taken is told so (it
    /// reported rank 0 closing its connection); the job goes on with the
    /// first.
    #[test]
    fn a_rank_joined_twice_is_told_why() {
        let rt = two_workers();
        rt.block_on(async {
            let port = free_port();
            let cfg = |r: Rank| {
                let mut c = TcpConfig::new(r, 3, format!("127.0.0.1:{port}"), "tok");
                c.timeout = Duration::from_secs(20);
                c
            };
            let c0 = tokio::spawn(TcpComm::connect(cfg(0)));
            // Either rank 1 may register first: the other is the one told.
            let mut a = tokio::spawn(TcpComm::connect(cfg(1)));
            let mut b = tokio::spawn(TcpComm::connect(cfg(1)));
            let ok = |j: Result<Result<TcpComm, CommError>, tokio::task::JoinError>| {
                j.unwrap_or_else(|e| panic!("{e}"))
                    .unwrap_or_else(|e| panic!("{e}"))
            };
            let (told, first) = tokio::time::timeout(Duration::from_secs(10), async {
                tokio::select! {
                    t = &mut a => (t, b),
                    t = &mut b => (t, a),
                }
            })
            .await
            .unwrap_or_else(|_| panic!("neither rank 1 was told"));
            let told_err = told.unwrap_or_else(|e| panic!("{e}")).err();
            let e = told_err.as_ref().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                e.contains("refused our connection: another process has already joined as rank 1"),
                "{e}"
            );
            // (Its own misconfiguration: no peer's failure passed on.)
            assert!(matches!(told_err, Some(CommError::Protocol { .. })), "{e}");
            let c2 = TcpComm::connect(cfg(2))
                .await
                .unwrap_or_else(|e| panic!("rank 2: {e}"));
            let (c0, c1) = (ok(c0.await), ok(first.await));
            // A third process as rank 1, once the job has started, is told
            // that (not a guess at a wrong token).
            let late = TcpComm::connect(cfg(1))
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                late.contains("have all joined")
                    && late.contains("second process running as rank 1"),
                "{late}"
            );
            let _ = tokio::join!(c0.shutdown(), c1.shutdown(), c2.shutdown());
        });
    }

    /// A rank of the job (its token) that disagrees on the job's size fails
    /// the whole start-up at once, every rank naming the sizes: before,
    /// rank 0 dropped it with a warning and waited out its timeout, then
    /// reported only that the rank "did not join".
    #[test]
    fn a_rank_with_another_job_size_fails_the_start_naming_it() {
        let rt = two_workers();
        rt.block_on(async {
            let port = free_port();
            let cfg = |r: Rank, n: u32| {
                let mut c = TcpConfig::new(r, n, format!("127.0.0.1:{port}"), "tok");
                // (Far past the test's own wait: a start-up that waited
                // for it would fail the test below.)
                c.timeout = Duration::from_secs(600);
                c
            };
            // Ranks 0 and 1 first (rank 1 has joined before rank 2 comes:
            // each is told by rank 0, which then stops listening).
            let mut ranks = vec![
                tokio::spawn(TcpComm::connect(cfg(0, 3))),
                tokio::spawn(TcpComm::connect(cfg(1, 3))),
            ];
            tokio::time::sleep(Duration::from_secs(1)).await;
            ranks.push(tokio::spawn(TcpComm::connect(cfg(2, 4))));
            let errs =
                tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(ranks))
                    .await
                    .unwrap_or_else(|_| panic!("the start-up waited for the misfit"));
            for (r, j) in errs.into_iter().enumerate() {
                let e = j
                    .unwrap_or_else(|e| panic!("{e}"))
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| panic!("rank {r} started"));
                assert!(
                    e.contains("rank 2 says the job has 4 ranks, rank 0 that it has 3"),
                    "rank {r}: {e}"
                );
            }
        });
    }

    /// Without `BRAID_LISTEN`, a rank listens where it reaches rank 0: on
    /// loopback for a root on loopback (any 127.x address, or ::1).
    #[test]
    fn ranks_listen_toward_the_root() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            for (root, want) in [
                ("127.0.0.1:9", IpAddr::V4(Ipv4Addr::LOCALHOST)),
                ("127.0.0.2:9", IpAddr::V4(Ipv4Addr::LOCALHOST)),
                ("[::1]:9", IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)),
            ] {
                let got = interface_toward(root, 3)
                    .await
                    .unwrap_or_else(|e| panic!("{root}: {e}"));
                assert_eq!(got, want, "{root}");
            }
            let e = interface_toward("no-such-host.invalid:9", 3)
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("rank 3") && e.contains("no-such-host"), "{e}");
        });
    }

    /// Every connection gets keepalive probes (a lost host fails the job
    /// instead of hanging it), with the times the constants say.
    #[test]
    fn connections_watch_their_peer_host() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
            let s = TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let r = socket2::SockRef::from(&s);
            assert!(!r.keepalive().unwrap_or(true), "off before");
            watch_host(&s);
            assert!(r.keepalive().unwrap_or(false), "on after");
            #[cfg(target_os = "linux")]
            {
                assert_eq!(r.tcp_keepalive_time().ok(), Some(KEEPALIVE_IDLE));
                assert_eq!(r.tcp_keepalive_interval().ok(), Some(KEEPALIVE_INTERVAL));
                assert_eq!(r.tcp_keepalive_retries().ok(), Some(KEEPALIVE_PROBES));
            }
        });
    }

    /// A descriptor named by mistake (not a socket, or a listener on
    /// another port) is refused and left open; a listening socket handed
    /// over carries a 2-rank job, is taken only once, and is close-on-exec
    /// once taken.
    #[test]
    fn inherited_root_listeners_are_checked_and_taken_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            let file = std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("{e}"));
            let e = inherited_listener(file.as_raw_fd(), "127.0.0.1:1").err();
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.to_string().contains("not a listening socket")),
                "{e:?}"
            );
            assert!(file.metadata().is_ok(), "the refused descriptor stays open");

            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
            let root = l.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
            let port = l.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
            // A listener on another port than the root address's is
            // refused and left open.
            let other =
                std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
            let e = inherited_listener(other.as_raw_fd(), &root).err();
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.to_string().contains("not on the root address")),
                "{e:?}"
            );
            assert!(
                other.local_addr().is_ok(),
                "the refused listener stays open"
            );
            let fd = l.into_raw_fd();
            let token = random_token();
            let mut cfg0 = TcpConfig::new(0, 2, root.clone(), token.clone());
            cfg0.root_fd = Some(fd);
            let cfg1 = TcpConfig::new(1, 2, root, token);
            let r0 = tokio::spawn(TcpComm::connect(cfg0));
            let c1 = TcpComm::connect(cfg1)
                .await
                .unwrap_or_else(|e| panic!("rank 1: {e}"));
            let c0 = r0
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("rank 0: {e}"));
            let tag = Tag::new(OpId(7), 0);
            let got = c1.recv(0, tag);
            c0.send(1, tag, Buffer::from_vec(vec![1, 2, 3]))
                .await
                .unwrap_or_else(|e| panic!("send: {e}"));
            let got = got.await.unwrap_or_else(|e| panic!("recv: {e}"));
            assert_eq!(got.as_slice(), &[1, 2, 3]);
            let again = inherited_listener(fd, &format!("127.0.0.1:{port}")).err();
            assert!(
                again.is_some_and(|e| e.to_string().contains("taken already")),
                "taken once only"
            );
            // Taken, it is close-on-exec again (not inherited further).
            // SAFETY: fcntl only reads the flags of an open descriptor.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            assert!(flags != -1 && flags & libc::FD_CLOEXEC != 0, "{flags}");
            let (a, b) = futures::join!(c0.shutdown(), c1.shutdown());
            assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
        });
    }
}
