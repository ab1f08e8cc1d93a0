//! The tcp backend's wire format. Every length a peer sends is checked
//! against a limit before anything is allocated for it.
//!
//! ```text
//! connection opening (client -> server), then one ack byte back:
//!   "BRDH" | version u16 | kind u8 | token_len u16 | token | rank u32 | nranks u32
//!   <- b'K'                                  accepted
//!   <- b'R' | len u16 | reason (UTF-8)       refused, and why
//!   (a connection closed without either: not a braid rank's, or dropped)
//!
//! data frame (kind = data, one direction only: client -> server):
//!   "BRDF" | pieces u8 | 0u8 x 3 | tag u64 | len u64 | payload
//!   pieces 0: a whole message, `len` bytes of payload follow.
//!   pieces k >= 2 (lane 0 only): a message of `len` bytes split in k
//!   pieces (`stripe_piece`); piece 0 follows here, piece i as the next
//!   frame (pieces 0, len = the piece's length) on lane i.
//!
//! control message (kind = control, both directions, rank <-> rank 0):
//!   len u32 | kind u8 | body (len - 1 bytes)
//! ```
//! All integers are little-endian.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Rank;
use crate::tag::Tag;

/// Magic of the connection opening.
pub const HELLO_MAGIC: [u8; 4] = *b"BRDH";
/// Magic of each data frame.
pub const FRAME_MAGIC: [u8; 4] = *b"BRDF";
/// Wire protocol version.
pub const VERSION: u16 = 2;
/// Data connections a rank may open to one peer (lane 0 and the lanes that
/// carry the other pieces of a large message; see the tcp module doc).
pub const MAX_LANES: u8 = 8;
/// Size of a data frame header.
pub const FRAME_HEADER_LEN: usize = 24;
/// Longest job token accepted.
pub const MAX_TOKEN_LEN: usize = 1024;
/// Largest control message accepted.
pub const MAX_CONTROL_LEN: u32 = 64 << 20;
/// The byte a server answers an accepted opening with.
pub const ACK: u8 = b'K';
/// The byte a server answers a refused opening with, before the reason.
pub const REFUSED: u8 = b'R';
/// Longest refusal reason sent (a longer one is cut, at a character).
pub const MAX_REFUSAL_LEN: usize = 1024;

/// How a server answered a connection's opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Taken: frames or control messages follow.
    Accepted,
    /// Refused, with the server's reason (the connection then closes).
    Refused(String),
}

impl Answer {
    /// Encodes the answer.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Answer::Accepted => vec![ACK],
            Answer::Refused(reason) => {
                let mut end = reason.len().min(MAX_REFUSAL_LEN);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                let mut v = Vec::with_capacity(3 + end);
                v.push(REFUSED);
                v.extend_from_slice(&(end as u16).to_le_bytes());
                v.extend_from_slice(&reason.as_bytes()[..end]);
                v
            }
        }
    }

    /// Reads an answer, its reason's length checked before it is read.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Answer, WireError> {
        let mut b = [0u8; 1];
        r.read_exact(&mut b).await?;
        match b[0] {
            ACK => Ok(Answer::Accepted),
            REFUSED => {
                let mut len = [0u8; 2];
                r.read_exact(&mut len).await?;
                let len = usize::from(u16::from_le_bytes(len));
                if len > MAX_REFUSAL_LEN {
                    return Err(WireError::TooLong {
                        what: "refusal reason",
                        len: len as u64,
                        limit: MAX_REFUSAL_LEN as u64,
                    });
                }
                let mut reason = vec![0u8; len];
                r.read_exact(&mut reason).await?;
                Ok(Answer::Refused(
                    String::from_utf8_lossy(&reason).into_owned(),
                ))
            }
            k => Err(WireError::BadKind(k)),
        }
    }
}

/// What a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// Bootstrap and failure notices between a rank and rank 0.
    Control,
    /// Data frames from the connecting rank to the accepting rank: lane 0
    /// carries every message (whole, or a large one's first piece), lanes
    /// 1.. the other pieces of large messages, in lane 0's order.
    Data {
        /// Which of the pair's data connections, below [`MAX_LANES`].
        lane: u8,
    },
}

/// The opening of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// What the connection carries.
    pub kind: ConnKind,
    /// The job token.
    pub token: Vec<u8>,
    /// The connecting rank.
    pub rank: Rank,
    /// The job size the connecting rank believes in.
    pub nranks: u32,
}

/// Why bytes off the wire were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The stream did not start with the expected magic.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// Unsupported protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    /// Unknown connection or control kind.
    #[error("unknown kind {0}")]
    BadKind(u8),
    /// A length over its limit.
    #[error("{what} of {len} bytes is over the limit of {limit} bytes")]
    TooLong {
        /// What the length was for.
        what: &'static str,
        /// The claimed length.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// A malformed field.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The connection failed or ended early.
    #[error("{0}")]
    Io(String),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        WireError::Io(e.to_string())
    }
}

impl Hello {
    /// Encodes the opening.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(17 + self.token.len());
        v.extend_from_slice(&HELLO_MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.push(match self.kind {
            ConnKind::Control => 0,
            ConnKind::Data { lane } => 1 + lane,
        });
        v.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.token);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.nranks.to_le_bytes());
        v
    }

    /// Reads an opening, checking magic, version and token length first.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Hello, WireError> {
        let mut head = [0u8; 9];
        r.read_exact(&mut head).await?;
        let magic = [head[0], head[1], head[2], head[3]];
        if magic != HELLO_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([head[4], head[5]]);
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        let kind = match head[6] {
            0 => ConnKind::Control,
            k if k <= MAX_LANES => ConnKind::Data { lane: k - 1 },
            k => return Err(WireError::BadKind(k)),
        };
        let token_len = u16::from_le_bytes([head[7], head[8]]) as usize;
        if token_len > MAX_TOKEN_LEN {
            return Err(WireError::TooLong {
                what: "token",
                len: token_len as u64,
                limit: MAX_TOKEN_LEN as u64,
            });
        }
        let mut token = vec![0u8; token_len];
        r.read_exact(&mut token).await?;
        let mut tail = [0u8; 8];
        r.read_exact(&mut tail).await?;
        Ok(Hello {
            kind,
            token,
            rank: u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]),
            nranks: u32::from_le_bytes([tail[4], tail[5], tail[6], tail[7]]),
        })
    }
}

/// A data frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message tag.
    pub tag: Tag,
    /// Message length (of the whole message where it is striped).
    pub len: u64,
    /// 0: the payload is the whole message; k >= 2: the message's first
    /// of k pieces (lane 0 only).
    pub pieces: u8,
}

/// The split of a striped `len`-byte message into `k` pieces: piece i is
/// `[i * base, i * base + size)`, every piece `base` bytes (a multiple of
/// 4 KiB) but the last, which takes the rest. Sender and receiver both
/// compute it from (len, k).
pub fn stripe_piece(len: u64, k: u8, i: u8) -> (u64, u64) {
    let k = u64::from(k.max(1));
    let base = (len / k) & !4095;
    let i = u64::from(i).min(k - 1);
    let start = i * base;
    let size = if i + 1 == k { len - start } else { base };
    (start, size)
}

impl FrameHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC);
        b[4] = self.pieces;
        b[8..16].copy_from_slice(&self.tag.to_wire().to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes and validates a header; `max_len` bounds the payload length
    /// before anything is allocated for it.
    pub fn decode(b: &[u8; FRAME_HEADER_LEN], max_len: u64) -> Result<FrameHeader, WireError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != FRAME_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[5..8] != [0, 0, 0] || b[4] == 1 || b[4] > MAX_LANES {
            return Err(WireError::Malformed("frame flags"));
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8..16]);
        let tag = Tag::from_wire(u64::from_le_bytes(w)).ok_or(WireError::Malformed("tag"))?;
        w.copy_from_slice(&b[16..24]);
        let len = u64::from_le_bytes(w);
        if len > max_len {
            return Err(WireError::TooLong {
                what: "frame payload",
                len,
                limit: max_len,
            });
        }
        Ok(FrameHeader {
            tag,
            len,
            pieces: b[4],
        })
    }
}

/// A message on a control connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// rank -> 0: the address where the rank accepts data connections.
    Register(String),
    /// 0 -> rank: every rank's data address, by rank (entry 0 unused).
    Table(Vec<String>),
    /// rank -> 0: this rank has flushed its sends and is shutting down,
    /// after sending `sent[q]` messages to rank q.
    Done {
        /// Messages sent to each rank, by rank.
        sent: Vec<u64>,
    },
    /// 0 -> rank: rank `peer` finished after sending the receiver `sent`
    /// messages (a receive from it beyond those can never complete).
    Finished {
        /// The rank that finished.
        peer: Rank,
        /// Messages it sent the receiver in all.
        sent: u64,
    },
    /// 0 -> rank: every rank is done; leave.
    AllDone,
    /// Either way: rank `origin` aborted the job.
    Abort {
        /// The rank that aborted.
        origin: Rank,
        /// Why.
        reason: String,
    },
    /// 0 -> rank: rank `peer` died.
    Died {
        /// The dead rank.
        peer: Rank,
        /// What rank 0 saw.
        detail: String,
    },
}

fn put_str(v: &mut Vec<u8>, s: &str) {
    // A text past `MAX_TEXT` (an abort's reason built from a huge error,
    // say) is cut on a character boundary: rank 0 relays it to every rank,
    // and its length must fit the u32 it is written in.
    let cut;
    let s = if s.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        cut = format!("{} [cut from {} bytes]", &s[..end], s.len());
        cut.as_str()
    } else {
        s
    };
    v.extend_from_slice(&(s.len() as u32).to_le_bytes());
    v.extend_from_slice(s.as_bytes());
}

fn get_u32(b: &mut &[u8]) -> Result<u32, WireError> {
    if b.len() < 4 {
        return Err(WireError::Malformed("control message"));
    }
    let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    *b = &b[4..];
    Ok(v)
}

/// A little-endian u64 from a slice of exactly 8 bytes.
fn get_u64_le(c: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(c);
    u64::from_le_bytes(w)
}

fn get_str(b: &mut &[u8]) -> Result<String, WireError> {
    let n = get_u32(b)? as usize;
    if b.len() < n {
        return Err(WireError::Malformed("control string"));
    }
    let s = String::from_utf8_lossy(&b[..n]).into_owned();
    *b = &b[n..];
    Ok(s)
}

/// The longest text (an abort's reason, a death's detail, an address) a
/// control message carries; a longer one is cut.
pub const MAX_TEXT: usize = 64 << 10;

impl Control {
    /// Encodes the message with its length prefix.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            Control::Register(a) => {
                put_str(&mut body, a);
                0
            }
            Control::Table(t) => {
                body.extend_from_slice(&(t.len() as u32).to_le_bytes());
                for a in t {
                    put_str(&mut body, a);
                }
                1
            }
            Control::Done { sent } => {
                body.extend_from_slice(&(sent.len() as u32).to_le_bytes());
                for c in sent {
                    body.extend_from_slice(&c.to_le_bytes());
                }
                2
            }
            Control::Finished { peer, sent } => {
                body.extend_from_slice(&peer.to_le_bytes());
                body.extend_from_slice(&sent.to_le_bytes());
                6
            }
            Control::AllDone => 3,
            Control::Abort { origin, reason } => {
                body.extend_from_slice(&origin.to_le_bytes());
                put_str(&mut body, reason);
                4
            }
            Control::Died { peer, detail } => {
                body.extend_from_slice(&peer.to_le_bytes());
                put_str(&mut body, detail);
                5
            }
        };
        let mut v = Vec::with_capacity(5 + body.len());
        v.extend_from_slice(&(body.len() as u32 + 1).to_le_bytes());
        v.push(kind);
        v.extend_from_slice(&body);
        v
    }

    /// Reads one message; `Ok(None)` on a clean end of stream.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Control>, WireError> {
        let mut lb = [0u8; 4];
        match r.read_exact(&mut lb).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_le_bytes(lb);
        if len == 0 || len > MAX_CONTROL_LEN {
            return Err(WireError::TooLong {
                what: "control message",
                len: len as u64,
                limit: MAX_CONTROL_LEN as u64,
            });
        }
        let mut buf = vec![0u8; len as usize];
        r.read_exact(&mut buf).await?;
        Self::decode(&buf).map(Some)
    }

    fn decode(buf: &[u8]) -> Result<Control, WireError> {
        let kind = buf[0];
        let mut b = &buf[1..];
        Ok(match kind {
            0 => Control::Register(get_str(&mut b)?),
            1 => {
                let n = get_u32(&mut b)? as usize;
                if n > b.len() / 4 + 1 {
                    return Err(WireError::Malformed("address table"));
                }
                let mut t = Vec::with_capacity(n);
                for _ in 0..n {
                    t.push(get_str(&mut b)?);
                }
                Control::Table(t)
            }
            2 => {
                let n = get_u32(&mut b)? as usize;
                if b.len() != n.saturating_mul(8) {
                    return Err(WireError::Malformed("message counts"));
                }
                Control::Done {
                    sent: b.chunks_exact(8).map(get_u64_le).collect(),
                }
            }
            6 => {
                let peer = get_u32(&mut b)?;
                if b.len() != 8 {
                    return Err(WireError::Malformed("message count"));
                }
                Control::Finished {
                    peer,
                    sent: get_u64_le(b),
                }
            }
            3 => Control::AllDone,
            4 => Control::Abort {
                origin: get_u32(&mut b)?,
                reason: get_str(&mut b)?,
            },
            5 => Control::Died {
                peer: get_u32(&mut b)?,
                detail: get_str(&mut b)?,
            },
            k => return Err(WireError::BadKind(k)),
        })
    }

    /// Writes the message.
    pub async fn write<W: AsyncWrite + Unpin>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&self.encode()).await?;
        w.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tag::OpId;

    #[test]
    fn header_roundtrip_and_limits() {
        let h = FrameHeader {
            tag: Tag::new(OpId(77), 3),
            len: 1 << 30,
            pieces: 0,
        };
        assert_eq!(FrameHeader::decode(&h.encode(), 1 << 31), Ok(h));
        let striped = FrameHeader { pieces: 4, ..h };
        assert_eq!(FrameHeader::decode(&striped.encode(), 1 << 31), Ok(striped));
        for bad in [1, MAX_LANES + 1] {
            let mut b = h.encode();
            b[4] = bad;
            assert!(FrameHeader::decode(&b, 1 << 31).is_err());
        }
        assert!(matches!(
            FrameHeader::decode(&h.encode(), 1 << 20),
            Err(WireError::TooLong { .. })
        ));
    }

    #[test]
    fn stripe_pieces_tile_the_message() {
        for len in [0u64, 1, 4095, 4096, 1 << 20, (1 << 20) + 12345, 3 << 24] {
            for k in 2..=MAX_LANES {
                let mut at = 0;
                for i in 0..k {
                    let (start, size) = stripe_piece(len, k, i);
                    assert_eq!(start, at, "len {len}, k {k}, piece {i}");
                    if i + 1 < k {
                        assert_eq!(start % 4096, 0);
                        assert_eq!(size, stripe_piece(len, k, 0).1);
                    }
                    at += size;
                }
                assert_eq!(at, len, "len {len}, k {k}");
            }
        }
    }

    #[test]
    fn random_headers_are_refused() {
        // A cheap xorshift so the test needs no extra crate.
        let mut s = 0x9e3779b97f4a7c15u64;
        for _ in 0..10_000 {
            let mut b = [0u8; FRAME_HEADER_LEN];
            for c in b.chunks_mut(8) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                c.copy_from_slice(&s.to_le_bytes()[..c.len()]);
            }
            assert!(FrameHeader::decode(&b, u64::MAX).is_err());
        }
    }

    #[tokio::test]
    async fn control_roundtrip() {
        let msgs = vec![
            Control::Register("127.0.0.1:5".into()),
            Control::Table(vec!["".into(), "a:1".into()]),
            Control::Done {
                sent: vec![0, 3, u64::MAX],
            },
            Control::Finished { peer: 4, sent: 17 },
            Control::AllDone,
            Control::Abort {
                origin: 3,
                reason: "x".into(),
            },
            Control::Died {
                peer: 2,
                detail: "eof".into(),
            },
        ];
        let mut bytes = Vec::new();
        for m in &msgs {
            bytes.extend(m.encode());
        }
        let mut r = &bytes[..];
        for m in &msgs {
            assert_eq!(Control::read(&mut r).await.unwrap().as_ref(), Some(m));
        }
        assert_eq!(Control::read(&mut r).await.unwrap(), None);
    }

    /// A reason past `MAX_TEXT` is cut on a character boundary and says
    /// so; the message still reads back whole.
    #[tokio::test]
    async fn long_texts_are_cut() {
        let reason = "é".repeat(MAX_TEXT);
        let bytes = Control::Abort { origin: 1, reason }.encode();
        let got = Control::read(&mut &bytes[..]).await.unwrap();
        match got {
            Some(Control::Abort { origin: 1, reason }) => {
                assert!(reason.len() < MAX_TEXT + 64, "{}", reason.len());
                assert!(reason.ends_with(&format!("[cut from {} bytes]", 2 * MAX_TEXT)));
            }
            other => panic!("{other:?}"),
        }
    }

    /// Answers read back as written; a long reason is cut at a character
    /// within the limit; an unknown byte or an oversized length is refused.
    #[tokio::test]
    async fn answers_roundtrip_and_limits() {
        for a in [
            Answer::Accepted,
            Answer::Refused(String::new()),
            Answer::Refused("rank 3 says the job has 5 ranks".into()),
        ] {
            assert_eq!(Answer::read(&mut &a.encode()[..]).await.unwrap(), a);
        }
        let long = "é".repeat(MAX_REFUSAL_LEN);
        match Answer::read(&mut &Answer::Refused(long.clone()).encode()[..]).await {
            Ok(Answer::Refused(r)) => {
                assert!(r.len() <= MAX_REFUSAL_LEN && r.len() >= MAX_REFUSAL_LEN - 1);
                assert!(long.starts_with(&r));
            }
            other => panic!("{other:?}"),
        }
        let over = [REFUSED, 0xff, 0xff];
        assert!(matches!(
            Answer::read(&mut &over[..]).await,
            Err(WireError::TooLong { .. })
        ));
        assert!(matches!(
            Answer::read(&mut &b"x"[..]).await,
            Err(WireError::BadKind(b'x'))
        ));
        assert!(Answer::read(&mut &[REFUSED, 4, 0, b'a'][..]).await.is_err());
    }

    #[tokio::test]
    async fn hello_roundtrip_and_garbage() {
        for lane in [0, 3, MAX_LANES - 1] {
            let h = Hello {
                kind: ConnKind::Data { lane },
                token: b"t".to_vec(),
                rank: 1,
                nranks: 2,
            };
            assert_eq!(Hello::read(&mut &h.encode()[..]).await.unwrap(), h);
        }
        let mut bad = Hello {
            kind: ConnKind::Control,
            token: b"t".to_vec(),
            rank: 1,
            nranks: 2,
        }
        .encode();
        bad[6] = MAX_LANES + 1;
        assert!(matches!(
            Hello::read(&mut &bad[..]).await,
            Err(WireError::BadKind(_))
        ));
        let h = Hello {
            kind: ConnKind::Data { lane: 0 },
            token: b"secret".to_vec(),
            rank: 4,
            nranks: 8,
        };
        let bytes = h.encode();
        assert_eq!(Hello::read(&mut &bytes[..]).await.unwrap(), h);
        let garbage = [0xffu8; 64];
        assert!(Hello::read(&mut &garbage[..]).await.is_err());
        let mut long = bytes.clone();
        long[7..9].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            Hello::read(&mut &long[..]).await,
            Err(WireError::TooLong { .. })
        ));
    }
}
