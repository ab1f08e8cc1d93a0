//! How collectives frame their messages, convert typed data, and check that
//! every rank made the same call.
//!
//! Every message starts with a 32-byte `Meta`:
//!
//! ```text
//!   kind u8 | dtype u8 | flags u8 | 0u8 | aux u32 | count u64 | seq u64 | meta_len u32 | 0u32
//!   then meta_len bytes of caller metadata, then the data inline
//!   (small data), or, with flag DATA_FOLLOWS, the data as the next message
//!   of the same (src, tag): large data is never copied into a frame.
//! ```

use std::borrow::Cow;
use std::future::Future;

use braid_core::{Buffer, Communicator, Rank, Tag};
use braid_kernels::{DType, Element};
use bytes::Bytes;

use crate::error::{CollError, CollKind, Site};

/// Size of `Meta` on the wire.
pub(crate) const META_LEN: usize = 32;
/// Data up to this size travels inside the first message.
pub(crate) const INLINE_MAX: usize = 16 << 10;
/// Flag: the data is the next message.
pub(crate) const DATA_FOLLOWS: u8 = 1;
/// Flag: this is a stream's finish marker; `count` is the number of data
/// messages sent before it.
pub(crate) const FINISH: u8 = 2;
/// Stage used by the call-signature check.
pub(crate) const SIG_STAGE: u8 = 255;

/// The fixed header of a collective's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub kind: CollKind,
    pub dtype: DType,
    pub flags: u8,
    pub aux: u32,
    pub count: u64,
    pub seq: u64,
}

impl Meta {
    pub fn new(kind: CollKind, dtype: DType) -> Self {
        Meta {
            kind,
            dtype,
            flags: 0,
            aux: 0,
            count: 0,
            seq: 0,
        }
    }

    pub fn aux(mut self, aux: u32) -> Self {
        self.aux = aux;
        self
    }

    pub fn count(mut self, count: u64) -> Self {
        self.count = count;
        self
    }

    pub fn seq(mut self, seq: u64) -> Self {
        self.seq = seq;
        self
    }

    pub fn flags(mut self, flags: u8) -> Self {
        self.flags |= flags;
        self
    }

    fn encode(&self, meta_len: usize, out: &mut Vec<u8>) {
        out.push(self.kind.code());
        out.push(self.dtype.code());
        out.push(self.flags);
        out.push(0);
        out.extend_from_slice(&self.aux.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(meta_len as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<(Meta, usize)> {
        if b.len() < META_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let meta = Meta {
            kind: CollKind::from_code(b[0])?,
            dtype: DType::from_code(b[1])?,
            flags: b[2],
            aux: u32_at(4),
            count: u64_at(8),
            seq: u64_at(16),
        };
        Some((meta, u32_at(24) as usize))
    }
}

/// A received framed message.
#[derive(Debug, Clone)]
pub(crate) struct Framed {
    pub meta: Meta,
    pub user_meta: Bytes,
    pub data: Buffer,
}

/// Sends a framed message: one message when the data is small, two (header
/// then data, zero-copy) when it is large. Ordering is fixed at the call.
pub(crate) fn send_framed(
    comm: &dyn Communicator,
    site: Site,
    dst: Rank,
    tag: Tag,
    meta: Meta,
    user_meta: &[u8],
    data: Buffer,
) -> impl Future<Output = Result<(), CollError>> + Send + 'static {
    let inline = data.len() <= INLINE_MAX;
    let meta = if inline { meta } else { meta.flags(DATA_FOLLOWS) };
    let mut head = Vec::with_capacity(META_LEN + user_meta.len() + if inline { data.len() } else { 0 });
    meta.encode(user_meta.len(), &mut head);
    head.extend_from_slice(user_meta);
    let second = if inline {
        head.extend_from_slice(data.as_slice());
        None
    } else {
        Some(data)
    };
    let f1 = comm.send(dst, tag, Buffer::from_vec(head));
    let f2 = second.map(|d| comm.send(dst, tag, d));
    async move {
        f1.await.map_err(|e| site.comm(e))?;
        if let Some(f2) = f2 {
            f2.await.map_err(|e| site.comm(e))?;
        }
        Ok(())
    }
}

/// Receives a framed message from `src` and checks its kind.
pub(crate) async fn recv_framed(comm: &dyn Communicator, site: Site, src: Rank, tag: Tag) -> Result<Framed, CollError> {
    let first = comm.recv(src, tag).await.map_err(|e| site.comm(e))?;
    let Some((meta, meta_len)) = Meta::decode(first.as_slice()) else {
        return Err(site.mismatch(src, "received a message that is not a collective frame"));
    };
    if meta.kind != site.coll {
        return Err(site.mismatch(
            src,
            format!("rank {src} called {} where this rank called {}", meta.kind, site.coll),
        ));
    }
    let body = META_LEN + meta_len;
    if first.len() < body {
        return Err(site.mismatch(src, "truncated frame"));
    }
    let user_meta = first.bytes().slice(META_LEN..body);
    let data = if meta.flags & DATA_FOLLOWS != 0 {
        comm.recv(src, tag).await.map_err(|e| site.comm(e))?
    } else {
        first.slice(body..first.len())
    };
    Ok(Framed {
        meta,
        user_meta,
        data,
    })
}

struct TypedOwner<T: Element>(Vec<T>);

impl<T: Element> AsRef<[u8]> for TypedOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// A typed vector as a buffer, without copying.
pub(crate) fn vec_to_buffer<T: Element>(v: Vec<T>) -> Buffer {
    Buffer::from_bytes(Bytes::from_owner(TypedOwner(v)))
}

/// A buffer's bytes as elements: borrowed when aligned, copied otherwise.
pub(crate) fn typed<T: Element>(b: &Buffer) -> Option<Cow<'_, [T]>> {
    let s = b.as_slice();
    if s.len() % std::mem::size_of::<T>() != 0 {
        return None;
    }
    Some(match bytemuck::try_cast_slice::<u8, T>(s) {
        Ok(t) => Cow::Borrowed(t),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(s)),
    })
}

/// What a call looks like to its neighbours: the fields every rank must
/// agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Signature {
    pub dtype: DType,
    /// Root, reduction operator, or 0.
    pub aux: u32,
    /// Element count where it must agree, else 0.
    pub count: u64,
}

/// Checks that this rank's call matches its left neighbour's (each rank
/// sends its signature right and checks the one from the left; if any two
/// ranks differ, some neighbouring pair differs, so some rank notices and
/// aborts the job). Runs alongside the collective's own messages.
pub(crate) async fn check_signature(comm: &dyn Communicator, site: Site, sig: Signature) -> Result<(), CollError> {
    let n = comm.nranks();
    if n == 1 {
        return Ok(());
    }
    let me = site.rank;
    let tag = Tag::new(site.op, SIG_STAGE);
    let meta = Meta::new(site.coll, sig.dtype).aux(sig.aux).count(sig.count);
    let send = send_framed(comm, site, (me + 1) % n, tag, meta, &[], Buffer::default());
    let left = (me + n - 1) % n;
    let got = recv_framed(comm, site, left, tag).await?;
    send.await?;
    let m = got.meta;
    if m.dtype != sig.dtype {
        return Err(site.mismatch(left, format!("element type {} here, {} on rank {left}", sig.dtype, m.dtype)));
    }
    if m.aux != sig.aux {
        let what = match site.coll {
            CollKind::Broadcast => "root",
            CollKind::AllReduce | CollKind::ReduceScatter => "reduction operator",
            _ => "parameter",
        };
        return Err(site.mismatch(left, format!("{what} {} here, {} on rank {left}", sig.aux, m.aux)));
    }
    if m.count != sig.count {
        return Err(site.mismatch(left, format!("count {} here, {} on rank {left}", sig.count, m.count)));
    }
    Ok(())
}
