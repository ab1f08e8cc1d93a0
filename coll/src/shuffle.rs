//! Shuffle: chunks tagged with a partition id go to the rank that owns the
//! partition; once every rank has finished inserting, each rank extracts
//! its partitions.
//!
//! ```text
//!   insert(pid, chunk) ──> owner(pid) == me ? store : send to owner(pid)
//!   insert_finished()  ──> to every peer: FINISH(count of chunks sent it)
//!   receive loop per peer: store chunks until FINISH, check the count
//!   done when every peer's FINISH arrived and this rank finished
//!   extract(pid)       ──> the partition's chunks, by (source rank, seq)
//! ```
//!
//! Memory: every stored chunk is charged to the context's
//! `BufferResource` (host). A chunk that does not fit under the host limit
//! is spilled to a file in the temp directory (counted in the statistics'
//! spilled bytes) and read back on extraction.
//!
//! Cost: each chunk crosses the network once: alpha + m * beta per chunk.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use braid_core::{
    BufferResource, Context, Event, MemoryError, MemoryType, PackedData, Rank, Statistics, Tag,
};
use braid_kernels::DType;
use bytes::Bytes;
use futures::future::BoxFuture;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, Left, left_unfinished, start_then, until_abandoned};
use crate::spill::SpillDir;
use crate::wire::{Meta, recv_streams_all, send_finish, send_framed};

/// Which rank owns a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionOwner {
    /// Partition p on rank p mod N.
    RoundRobin,
    /// Partitions split into N contiguous ranges, in rank order.
    Contiguous,
}

impl PartitionOwner {
    /// The policy's number in a FINISH frame (every rank must use one).
    pub(crate) fn code(self) -> u64 {
        match self {
            PartitionOwner::RoundRobin => 0,
            PartitionOwner::Contiguous => 1,
        }
    }

    fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(PartitionOwner::RoundRobin),
            1 => Some(PartitionOwner::Contiguous),
            _ => None,
        }
    }

    /// The owner of partition `pid` of `nparts` among `nranks` (a job has
    /// at least one rank: 0 ranks are taken as 1).
    pub fn owner(self, pid: u32, nparts: u32, nranks: u32) -> Rank {
        let nranks = nranks.max(1);
        match self {
            PartitionOwner::RoundRobin => pid % nranks,
            PartitionOwner::Contiguous => (pid as u64 * nranks as u64 / nparts.max(1) as u64)
                .min(u64::from(nranks - 1)) as Rank,
        }
    }

    /// The partitions of `nparts` that `rank` owns among `nranks`, in
    /// order: those [`owner`](Self::owner) gives `rank`, computed from the
    /// policy (no walk over every partition, no list of them).
    pub fn owned(self, rank: Rank, nparts: u32, nranks: u32) -> impl Iterator<Item = u32> {
        let n = u64::from(nranks.max(1));
        let (np, r) = (u64::from(nparts), u64::from(rank));
        let (start, end, step) = match self {
            _ if r >= n => (0, 0, 1),
            PartitionOwner::RoundRobin => (r, np, n),
            // owner(p) = floor(p n / np) = r  <=>  r np <= p n < (r + 1) np.
            PartitionOwner::Contiguous => {
                let first = |k: u64| (k * np).div_ceil(n).min(np);
                (first(r), first(r + 1), 1)
            }
        };
        // (Every value is below `nparts`, a u32.)
        (start..end.max(start))
            .step_by(step as usize)
            .map(|p| p as u32)
    }
}

/// Fails unless peer `p`'s shuffle has this rank's layout: `theirs` is
/// its partition count and owner policy code ([`PartitionOwner::code`]).
/// Owners that differ but happen to route no chunk wrongly would split
/// partitions between ranks unnoticed; counts that differ likewise.
pub(crate) fn same_layout(
    site: Site,
    p: Rank,
    (nparts, owner): (u32, PartitionOwner),
    theirs: (u64, u64),
) -> Result<(), CollError> {
    if theirs.0 != u64::from(nparts) {
        return Err(site.mismatch(
            p,
            format!("{nparts} partitions here, {} on rank {p}", theirs.0),
        ));
    }
    if theirs.1 != owner.code() {
        let o = PartitionOwner::from_code(theirs.1)
            .map_or_else(|| format!("code {}", theirs.1), |o| format!("{o:?}"));
        return Err(site.mismatch(p, format!("{owner:?} owners here, {o} on rank {p}")));
    }
    Ok(())
}

enum Stored {
    Mem(PackedData),
    Spilled {
        path: PathBuf,
        metadata: Bytes,
        len: usize,
    },
}

/// Stored chunks of one partition: (source rank, seq, chunk).
type Partition = Vec<(Rank, u64, Stored)>;

struct Store {
    parts: Mutex<HashMap<u32, Partition>>,
    resource: Arc<BufferResource>,
    stats: Arc<Statistics>,
    dir: SpillDir,
    next_file: AtomicU64,
}

impl Store {
    fn put(
        &self,
        site: Site,
        pid: u32,
        src: Rank,
        seq: u64,
        chunk: PackedData,
    ) -> Result<(), CollError> {
        let len = chunk.data.len();
        let stored = match self
            .resource
            .reserve_or_fail(len as u64, &[MemoryType::Host])
        {
            Ok(mut r) => {
                let data = r
                    .adopt(chunk.data.into_bytes())
                    .map_err(|e| site.memory(e))?;
                Stored::Mem(PackedData {
                    metadata: chunk.metadata,
                    data,
                })
            }
            Err(_) => {
                let dir = self
                    .dir
                    .ready()
                    .map_err(|e| site.memory(MemoryError::Spill(e)))?;
                let path = dir.join(format!(
                    "chunk-{}",
                    self.next_file.fetch_add(1, Ordering::Relaxed)
                ));
                write_new(&path, chunk.data.as_slice()).map_err(|e| {
                    site.memory(MemoryError::Spill(format!("{}: {e}", path.display())))
                })?;
                self.stats.record_spill(len as u64);
                Stored::Spilled {
                    path,
                    metadata: chunk.metadata,
                    len,
                }
            }
        };
        self.parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(pid)
            .or_default()
            .push((src, seq, stored));
        Ok(())
    }
}

/// Writes a new file (never through an existing name or link), readable by
/// this user only.
fn write_new(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)?.write_all(data)
}

#[derive(Default)]
struct State {
    sent_to: Vec<u64>,
    local_seq: u64,
    finished: bool,
    /// Dropped before `insert_finished`: the core fails instead of waiting.
    abandoned: Option<Left>,
    sends: Vec<BoxFuture<'static, Result<(), CollError>>>,
    /// Partitions extracted already (each may be taken once), with the
    /// error that lost one whose spilled chunk could not be read back (a
    /// second call repeats it rather than say "extracted already").
    extracted: HashMap<u32, Result<(), CollError>>,
}

/// A shuffle of chunks into `nparts` partitions (one instance per use).
pub struct Shuffle {
    site: Site,
    ctx: Context,
    nparts: u32,
    owner: PartitionOwner,
    state: Arc<Mutex<State>>,
    store: Arc<Store>,
    local_done: Event,
    done: Event,
    progress: Mutex<Progress>,
}

/// A shuffle dropped before this rank finished inserting fails its core
/// (and with it the job) instead of leaving it, and every peer, waiting for
/// a finish that cannot come.
impl Drop for Shuffle {
    fn drop(&mut self) {
        self.abandon(Left::Dropped);
    }
}

/// The shuffle's core: running, or its outcome (kept for every later call,
/// so that a failed shuffle never reads as finished).
enum Progress {
    Running(Handle<()>),
    Ended(Result<(), CollError>),
}

impl Shuffle {
    /// Starts a shuffle into `nparts` partitions owned as `owner` says;
    /// `callback` runs once every rank has finished inserting.
    pub fn new(
        ctx: &Context,
        nparts: u32,
        owner: PartitionOwner,
        callback: Option<Callback>,
    ) -> Self {
        let site = Site::next(ctx, CollKind::Shuffle);
        let op = site.op;
        let n = ctx.nranks();
        let store = Arc::new(Store {
            parts: Mutex::new(HashMap::new()),
            resource: ctx.resource().clone(),
            stats: ctx.statistics().clone(),
            dir: SpillDir::new(site.rank, op),
            next_file: AtomicU64::new(0),
        });
        let state = Arc::new(Mutex::new(State {
            sent_to: vec![0; n as usize],
            ..Default::default()
        }));
        let local_done = Event::new();
        let done = Event::new();
        let comm = ctx.comm().clone();
        let (st, ld, d2, store2) = (
            state.clone(),
            local_done.clone(),
            done.clone(),
            store.clone(),
        );
        let handle = start_then(ctx, CollKind::Shuffle, op, callback, Some(d2), async move {
            let me = site.rank;
            let tag = Tag::new(op, 0);
            let peers = (0..n).filter(|p| *p != me);
            let recv = recv_streams_all(comm.as_ref(), site, peers, tag, |p, f| {
                if f.meta.aux >= nparts {
                    return Err(site.mismatch(
                        p,
                        format!(
                            "partition {} from rank {p} is not below {nparts}",
                            f.meta.aux
                        ),
                    ));
                }
                // A chunk this rank does not own (the sender's owner policy
                // differs) would never be extracted: lost data.
                let to = owner.owner(f.meta.aux, nparts, n);
                if to != me {
                    return Err(site.mismatch(
                        p,
                        format!(
                            "partition {} from rank {p} belongs to rank {to} here ({owner:?} owners)",
                            f.meta.aux
                        ),
                    ));
                }
                let chunk = PackedData {
                    metadata: f.user_meta,
                    data: f.data,
                };
                store2.put(site, f.meta.aux, p, f.meta.seq, chunk)
            });
            // Dropped unfinished here: fail now, not after the peers'
            // streams (which may be abandoned too).
            let left = || st.lock().unwrap_or_else(|p| p.into_inner()).abandoned;
            let fins = until_abandoned(recv, &ld, comm.as_ref(), site, left).await?;
            for (p, fin) in fins {
                same_layout(site, p, (nparts, owner), (fin.aux.into(), fin.seq))?;
            }
            ld.wait().await;
            if let Some(how) = left() {
                return Err(left_unfinished(comm.as_ref(), site, how).await);
            }
            let sends = std::mem::take(&mut st.lock().unwrap_or_else(|p| p.into_inner()).sends);
            futures::future::try_join_all(sends).await?;
            Ok(())
        });
        Shuffle {
            site,
            ctx: ctx.clone(),
            nparts,
            owner,
            state,
            store,
            local_done,
            done,
            progress: Mutex::new(Progress::Running(handle)),
        }
    }

    /// The number of partitions.
    pub fn num_partitions(&self) -> u32 {
        self.nparts
    }

    /// The partitions this rank owns (none where there are fewer
    /// partitions than ranks). A rank that extracts nothing learns the
    /// shuffle's outcome (a peer's mismatched call, say) only from
    /// [`Shuffle::wait`]; without it, the failure reaches it as the job's
    /// abort at its next call or its end.
    pub fn local_partitions(&self) -> impl Iterator<Item = u32> + use<> {
        self.owner
            .owned(self.site.rank, self.nparts, self.ctx.nranks())
    }

    /// Inserts a chunk of partition `pid`; it leaves for its owner now. A
    /// chunk the transport refuses at once (over its message limit) is an
    /// error here as well as the collective's.
    pub fn insert(&self, pid: u32, chunk: PackedData) -> Result<(), CollError> {
        if pid >= self.nparts {
            return Err(self
                .site
                .invalid(format!("partition {pid} is not below {}", self.nparts)));
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return Err(self.site.invalid("insert after insert_finished"));
        }
        let seq = s.local_seq;
        s.local_seq += 1;
        let dst = self.owner.owner(pid, self.nparts, self.ctx.nranks());
        if dst == self.site.rank {
            // Stored under the state's lock, as a send is posted under it:
            // an `insert_finished` on another thread then waits for the
            // store, so `extract` sees every chunk accepted before it
            // (stored after the lock, a chunk could land behind an
            // extraction and be lost while `insert` said Ok). A failed
            // store (a spill write) fails the collective too, as a failed
            // send does: the partition would be short of a chunk.
            let r = self.store.put(self.site, pid, dst, seq, chunk);
            if let Err(e) = &r {
                s.sends.push(Box::pin(std::future::ready(Err(e.clone()))));
            }
            return r;
        }
        s.sent_to[dst as usize] += 1;
        let meta = Meta::new(CollKind::Shuffle, DType::Bytes).aux(pid).seq(seq);
        let tag = Tag::new(self.site.op, 0);
        let mut f = send_framed(
            self.ctx.comm().as_ref(),
            self.site,
            dst,
            tag,
            meta,
            &chunk.metadata,
            chunk.data,
        );
        // Kept only if the backend did not finish it within the call, so a
        // long stream does not hold a future per chunk. An error is kept
        // too (the core reports it) and returned now: the chunk is lost,
        // and a peer would otherwise only see a count that does not match.
        match futures::FutureExt::now_or_never(&mut f) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                s.sends.push(Box::pin(std::future::ready(Err(e.clone()))));
                return Err(e);
            }
            None => s.sends.push(Box::pin(f)),
        }
        Ok(())
    }

    /// Says this rank has inserted everything.
    pub fn insert_finished(&self) -> Result<(), CollError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return Err(self.site.invalid("insert_finished called twice"));
        }
        s.finished = true;
        let meta = Meta::new(CollKind::Shuffle, DType::Bytes)
            .aux(self.nparts)
            .seq(self.owner.code());
        let tag = Tag::new(self.site.op, 0);
        let sent_to = s.sent_to.clone();
        let fin = send_finish(self.ctx.comm().as_ref(), self.site, tag, meta, |p| {
            sent_to[p as usize]
        });
        s.sends.extend(fin);
        drop(s);
        self.local_done.set();
        Ok(())
    }

    /// Waits until every rank has finished inserting. Called before this
    /// rank's own `insert_finished`, it fails (and with it the job), as
    /// nothing could end the wait.
    pub async fn wait(&self) -> Result<(), CollError> {
        self.abandon(Left::Waited);
        self.done.wait().await;
        self.result()
    }

    /// Like [`Shuffle::wait`], blocking the calling thread (from a job's
    /// task too: see [`crate::Handle::wait`]).
    pub fn wait_blocking(&self) -> Result<(), CollError> {
        self.abandon(Left::Waited);
        if let Err(e) = self
            .done
            .wait_blocking_beside(self.ctx.progress().runtime_id())
        {
            return Err(self.site.invalid(format!("Shuffle::wait_blocking: {e}")));
        }
        self.result()
    }

    /// Ends this rank's part as left unfinished (`how`) unless it finished
    /// inserting: the core then fails instead of waiting for a finish that
    /// cannot come (and for the peers, which wait for this rank's).
    fn abandon(&self, how: Left) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !s.finished {
            s.finished = true;
            s.abandoned = Some(how);
            drop(s);
            self.local_done.set();
        }
    }

    /// The core's outcome, once `done` is set.
    fn result(&self) -> Result<(), CollError> {
        let mut p = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let r = match std::mem::replace(&mut *p, Progress::Ended(Ok(()))) {
            Progress::Running(h) => h.take(),
            Progress::Ended(r) => r,
        };
        *p = Progress::Ended(r.clone());
        r
    }

    /// Waits until every rank has finished inserting, then takes partition
    /// `pid`'s chunks (owned by this rank), ordered by (source rank, seq).
    /// A partition is taken once: another rank's, or one taken already, is
    /// an error (not an empty partition); so is a call before this rank's
    /// `insert_finished` (see [`Shuffle::wait`]).
    pub async fn extract(&self, pid: u32) -> Result<Vec<PackedData>, CollError> {
        self.abandon(Left::Extracted);
        self.wait().await?;
        self.take(pid)
    }

    fn take(&self, pid: u32) -> Result<Vec<PackedData>, CollError> {
        if pid >= self.nparts {
            return Err(self
                .site
                .invalid(format!("partition {pid} is not below {}", self.nparts)));
        }
        let owner = self.owner.owner(pid, self.nparts, self.ctx.nranks());
        if owner != self.site.rank {
            return Err(self.site.invalid(format!(
                "partition {pid} belongs to rank {owner} ({:?} owners)",
                self.owner
            )));
        }
        match self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extracted
            .entry(pid)
        {
            std::collections::hash_map::Entry::Occupied(e) => {
                return Err(match e.get() {
                    Err(lost) => lost.clone(),
                    Ok(()) => self
                        .site
                        .invalid(format!("partition {pid} was extracted already")),
                });
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Ok(()));
            }
        }
        let r = self.take_stored(pid);
        if let Err(e) = &r {
            self.state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extracted
                .insert(pid, Err(e.clone()));
        }
        r
    }

    /// Partition `pid`'s chunks out of the store (once), spilled ones read
    /// back; on an error the rest are dropped (their files with the store).
    fn take_stored(&self, pid: u32) -> Result<Vec<PackedData>, CollError> {
        let mut chunks = self
            .store
            .parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pid)
            .unwrap_or_default();
        chunks.sort_by_key(|(src, seq, _)| (*src, *seq));
        let mut out = Vec::with_capacity(chunks.len());
        for (_, _, s) in chunks {
            out.push(match s {
                Stored::Mem(p) => p,
                Stored::Spilled {
                    path,
                    metadata,
                    len,
                } => {
                    let bytes = std::fs::read(&path).map_err(|e| {
                        self.site
                            .memory(MemoryError::Spill(format!("{}: {e}", path.display())))
                    })?;
                    let _ = std::fs::remove_file(&path);
                    if bytes.len() != len {
                        return Err(self.site.memory(MemoryError::Spill(format!(
                            "{}: read {} bytes back, wrote {len}",
                            path.display(),
                            bytes.len()
                        ))));
                    }
                    // Charged like a chunk kept in memory (over the limit
                    // if need be: the caller asked for it), so what is
                    // allocated after sees it.
                    let mut r = self.store.resource.reserve(len as u64, &[MemoryType::Host]);
                    let data = r
                        .adopt(Bytes::from(bytes))
                        .map_err(|e| self.site.memory(e))?;
                    PackedData { metadata, data }
                }
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `owned` lists exactly the partitions `owner` gives a rank, in order,
    /// for both policies, against asking `owner` of every partition; and
    /// stays cheap where that walk would be billions of steps.
    #[test]
    fn owned_partitions_are_those_the_owner_names() {
        for policy in [PartitionOwner::RoundRobin, PartitionOwner::Contiguous] {
            for nranks in [1u32, 2, 3, 4, 5, 8] {
                for nparts in [0u32, 1, 2, 3, 7, 8, 13, 64, 100] {
                    let mut seen = 0;
                    for r in 0..nranks + 1 {
                        let want: Vec<u32> = (0..nparts)
                            .filter(|&p| r < nranks && policy.owner(p, nparts, nranks) == r)
                            .collect();
                        let got: Vec<u32> = policy.owned(r, nparts, nranks).collect();
                        assert_eq!(
                            got, want,
                            "{policy:?}, rank {r} of {nranks}, {nparts} parts"
                        );
                        seen += got.len();
                    }
                    assert_eq!(seen, nparts as usize, "{policy:?} {nranks} {nparts}");
                }
            }
            let first = policy.owned(3, u32::MAX, 8).next();
            let want = match policy {
                PartitionOwner::RoundRobin => 3,
                PartitionOwner::Contiguous => (3 * u64::from(u32::MAX)).div_ceil(8) as u32,
            };
            assert_eq!(first, Some(want), "{policy:?}");
            assert_eq!(policy.owner(want, u32::MAX, 8), 3);
            assert_eq!(policy.owner(want - 1, u32::MAX, 8), 2);
        }
    }

    /// One rank of an in-process world where every chunk spills (a host
    /// limit of 0), and its runtime.
    fn spilling_rank() -> (tokio::runtime::Runtime, Context) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let limits = braid_core::MemoryLimits {
            device: None,
            host: Some(0),
        };
        let spec = braid_core::WorldSpec::Local { nranks: 1 };
        let mut ctxs = rt
            .block_on(braid_core::world::contexts(&spec, limits))
            .unwrap();
        let ctx = ctxs.pop().unwrap();
        (rt, ctx)
    }

    fn chunk(bytes: Vec<u8>) -> PackedData {
        PackedData {
            metadata: Bytes::new(),
            data: braid_core::Buffer::from_vec(bytes),
        }
    }

    /// A spilled chunk that cannot be read back fails its extraction, and
    /// a second extraction repeats that error (it said "extracted
    /// already", hiding why the partition was lost).
    #[test]
    fn a_lost_spill_file_fails_every_extraction_of_its_partition() {
        let (rt, ctx) = spilling_rank();
        let sh = Shuffle::new(&ctx, 2, PartitionOwner::RoundRobin, None);
        for i in 0..3u8 {
            sh.insert(0, chunk(vec![i; 100])).unwrap();
        }
        sh.insert(1, chunk(vec![9; 10])).unwrap();
        sh.insert_finished().unwrap();
        let dir = sh.store.dir.ready().unwrap().to_path_buf();
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(files.len(), 4, "every chunk spilled");
        std::fs::remove_file(dir.join("chunk-1")).unwrap();
        for _ in 0..2 {
            let e = rt.block_on(sh.extract(0)).unwrap_err().to_string();
            assert!(e.contains("chunk-1"), "{e}");
        }
        // The other partition is whole.
        let p1 = rt.block_on(sh.extract(1)).unwrap();
        assert_eq!(p1.len(), 1);
        assert_eq!(p1[0].data.as_slice(), &[9; 10]);
        let e = rt.block_on(sh.extract(1)).unwrap_err().to_string();
        assert!(e.contains("extracted already"), "{e}");
    }

    /// A local chunk being stored (here a slow spill write) when another
    /// thread finishes the inserts and extracts: the insert either fails
    /// as after the finish, or its chunk is in the partition (it was
    /// stored after the state's lock and lost while `insert` said Ok).
    #[test]
    fn a_chunk_stored_while_another_thread_finishes_is_not_lost() {
        let (rt, ctx) = spilling_rank();
        for round in 0..3 {
            let sh = Arc::new(Shuffle::new(&ctx, 1, PartitionOwner::RoundRobin, None));
            let big = 64 << 20;
            let sh2 = sh.clone();
            let inserter = std::thread::spawn(move || sh2.insert(0, chunk(vec![7; big])));
            // Finish once the chunk's file is being written.
            let dir = sh.store.dir.ready().unwrap().to_path_buf();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !dir.join("chunk-0").exists() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            sh.insert_finished().unwrap();
            let got = rt.block_on(sh.extract(0)).unwrap();
            let inserted = inserter.join().unwrap();
            match inserted {
                Ok(()) => {
                    assert_eq!(got.len(), 1, "round {round}: an accepted chunk was lost");
                    assert_eq!(got[0].data.len(), big);
                }
                Err(e) => assert!(e.to_string().contains("after insert_finished"), "{e}"),
            }
        }
    }
}
