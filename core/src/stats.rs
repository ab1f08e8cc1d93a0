//! Statistics of one rank: bytes and messages per peer, time per operation,
//! spilled bytes. Cheap to record (atomics, one short lock per operation);
//! printable at the end of a job.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Rank;

/// Traffic with one peer.
#[derive(Debug, Default)]
struct PeerCounters {
    bytes_sent: AtomicU64,
    msgs_sent: AtomicU64,
    bytes_recv: AtomicU64,
    msgs_recv: AtomicU64,
}

/// Timing of one kind of operation.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct OpTiming {
    /// How many times it ran.
    pub count: u64,
    /// Total time.
    pub total: Duration,
    /// Longest single run.
    pub max: Duration,
}

/// A snapshot of the traffic with one peer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PeerTraffic {
    /// Bytes sent to the peer.
    pub bytes_sent: u64,
    /// Messages sent to the peer.
    pub msgs_sent: u64,
    /// Bytes received from the peer.
    pub bytes_recv: u64,
    /// Messages received from the peer.
    pub msgs_recv: u64,
}

/// Per-rank statistics.
#[derive(Debug)]
pub struct Statistics {
    rank: Rank,
    peers: Vec<PeerCounters>,
    /// By name, sorted: a handful of names, so a scan beats a map's
    /// string comparisons on every collective.
    ops: Mutex<Vec<(String, OpTiming)>>,
    spilled_bytes: AtomicU64,
    landed_bytes: AtomicU64,
    rejected_connections: AtomicU64,
}

impl Statistics {
    /// Empty statistics for `rank` of a job of `nranks`.
    pub fn new(rank: Rank, nranks: u32) -> Self {
        Statistics {
            rank,
            peers: (0..nranks).map(|_| PeerCounters::default()).collect(),
            ops: Mutex::new(Vec::new()),
            spilled_bytes: AtomicU64::new(0),
            landed_bytes: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
        }
    }

    /// Records a message of `bytes` sent to `peer`.
    pub fn record_send(&self, peer: Rank, bytes: usize) {
        if let Some(p) = self.peers.get(peer as usize) {
            p.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
            p.msgs_sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a message of `bytes` received from `peer`.
    pub fn record_recv(&self, peer: Rank, bytes: usize) {
        if let Some(p) = self.peers.get(peer as usize) {
            p.bytes_recv.fetch_add(bytes as u64, Ordering::Relaxed);
            p.msgs_recv.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records one run of operation `name` that took `elapsed`.
    pub fn record_op(&self, name: &str, elapsed: Duration) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let i = match ops.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                let at = ops.partition_point(|(n, _)| n.as_str() < name);
                ops.insert(at, (name.to_string(), OpTiming::default()));
                at
            }
        };
        let e = &mut ops[i].1;
        e.count += 1;
        e.total += elapsed;
        e.max = e.max.max(elapsed);
    }

    /// Records `bytes` spilled out of faster memory.
    pub fn record_spill(&self, bytes: u64) {
        self.spilled_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records `bytes` of a received message written straight into the
    /// memory its receive offered (`Communicator::recv_landing`).
    pub fn record_landed(&self, bytes: u64) {
        self.landed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records a connection refused for a bad token or bad handshake.
    pub fn record_rejected_connection(&self) {
        self.rejected_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Traffic with `peer` so far.
    pub fn peer(&self, peer: Rank) -> PeerTraffic {
        self.peers
            .get(peer as usize)
            .map(|p| PeerTraffic {
                bytes_sent: p.bytes_sent.load(Ordering::Relaxed),
                msgs_sent: p.msgs_sent.load(Ordering::Relaxed),
                bytes_recv: p.bytes_recv.load(Ordering::Relaxed),
                msgs_recv: p.msgs_recv.load(Ordering::Relaxed),
            })
            .unwrap_or_default()
    }

    /// Timing of operation `name`, if it ran.
    pub fn op(&self, name: &str) -> Option<OpTiming> {
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
    }

    /// Bytes spilled so far.
    pub fn spilled_bytes(&self) -> u64 {
        self.spilled_bytes.load(Ordering::Relaxed)
    }

    /// Received bytes written straight into their receiver's memory so far
    /// (the rest went through a receive buffer and a copy).
    pub fn landed_bytes(&self) -> u64 {
        self.landed_bytes.load(Ordering::Relaxed)
    }

    /// Connections refused so far (wrong token, bad handshake).
    pub fn rejected_connections(&self) -> u64 {
        self.rejected_connections.load(Ordering::Relaxed)
    }
}

/// Peers listed one row each in [`Statistics`]' text; the others share a
/// row of sums (the alternate form, `{:#}`, lists every peer).
pub const PEER_ROWS: usize = 16;

impl fmt::Display for Statistics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "statistics of rank {}:", self.rank)?;
        writeln!(
            f,
            "  {:>6} {:>14} {:>10} {:>14} {:>10}",
            "peer", "bytes sent", "msgs sent", "bytes recv", "msgs recv"
        )?;
        let busy = (0..self.peers.len())
            .map(|i| (i, self.peer(i as Rank)))
            .filter(|(_, t)| *t != PeerTraffic::default());
        // A row per peer is N rows a rank and N^2 for a job: past
        // `PEER_ROWS` peers the rest is summed in one row (`{:#}` lists all).
        let mut rest: Option<(usize, PeerTraffic)> = None;
        for (k, (i, t)) in busy.enumerate() {
            if k < PEER_ROWS || f.alternate() {
                writeln!(
                    f,
                    "  {:>6} {:>14} {:>10} {:>14} {:>10}",
                    i, t.bytes_sent, t.msgs_sent, t.bytes_recv, t.msgs_recv
                )?;
            } else {
                let (n, sum) = rest.get_or_insert_default();
                *n += 1;
                sum.bytes_sent += t.bytes_sent;
                sum.msgs_sent += t.msgs_sent;
                sum.bytes_recv += t.bytes_recv;
                sum.msgs_recv += t.msgs_recv;
            }
        }
        if let Some((n, t)) = rest {
            writeln!(
                f,
                "  {:>6} {:>14} {:>10} {:>14} {:>10}   ({n} more peers, summed)",
                "rest", t.bytes_sent, t.msgs_sent, t.bytes_recv, t.msgs_recv
            )?;
        }
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        if !ops.is_empty() {
            // The name column as wide as its longest name.
            let w = ops.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max(24);
            writeln!(
                f,
                "  {:<w$} {:>8} {:>12} {:>12}",
                "operation", "count", "total ms", "max ms"
            )?;
            for (name, t) in ops.iter() {
                writeln!(
                    f,
                    "  {:<w$} {:>8} {:>12.3} {:>12.3}",
                    name,
                    t.count,
                    t.total.as_secs_f64() * 1e3,
                    t.max.as_secs_f64() * 1e3
                )?;
            }
        }
        writeln!(f, "  spilled bytes: {}", self.spilled_bytes())?;
        writeln!(f, "  bytes received in place: {}", self.landed_bytes())?;
        let rej = self.rejected_connections();
        if rej > 0 {
            writeln!(f, "  rejected connections: {rej}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_counted_by_name_and_listed_in_name_order() {
        let s = Statistics::new(0, 1);
        let ms = Duration::from_millis;
        for (name, t) in [("b", 3), ("a", 1), ("b", 5), ("c", 2), ("a", 4)] {
            s.record_op(name, ms(t));
        }
        let a = s.op("a").unwrap_or_default();
        assert_eq!((a.count, a.total, a.max), (2, ms(5), ms(4)));
        let b = s.op("b").unwrap_or_default();
        assert_eq!((b.count, b.total, b.max), (2, ms(8), ms(5)));
        assert!(s.op("d").is_none());
        let text = s.to_string();
        let at = |n: &str| text.find(&format!("\n  {n} ")).unwrap_or(usize::MAX);
        assert!(
            at("a") < at("b") && at("b") < at("c") && at("c") < usize::MAX,
            "{text}"
        );
    }

    /// Past `PEER_ROWS` busy peers the text sums the rest in one row
    /// whose figures are the others' sums; `{:#}` lists every peer; idle
    /// peers are not counted.
    #[test]
    fn many_peers_share_a_row_of_sums() {
        let n = 40;
        let s = Statistics::new(0, n);
        for p in 1..n {
            s.record_send(p, 1000 + p as usize);
            s.record_recv(p, 10 * p as usize);
        }
        let text = s.to_string();
        let rows = |t: &str| {
            t.lines()
                .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                .count()
        };
        assert_eq!(rows(&text), PEER_ROWS, "{text}");
        let rest = (PEER_ROWS as u32 + 1..n).collect::<Vec<_>>();
        let sent: u64 = rest.iter().map(|&p| 1000 + u64::from(p)).sum();
        let recv: u64 = rest.iter().map(|&p| 10 * u64::from(p)).sum();
        let want = format!(
            "  {:>6} {:>14} {:>10} {:>14} {:>10}   ({} more peers, summed)",
            "rest",
            sent,
            rest.len(),
            recv,
            rest.len(),
            rest.len()
        );
        assert!(text.lines().any(|l| l == want), "{want}\n{text}");
        let all = format!("{s:#}");
        assert_eq!(rows(&all), n as usize - 1, "{all}");
        assert!(!all.contains("rest"), "{all}");
    }

    #[test]
    fn operation_columns_line_up_past_long_names() {
        let s = Statistics::new(0, 1);
        let long = "rolling: a name longer than the default column";
        s.record_op("short", Duration::from_millis(1));
        s.record_op(long, Duration::from_millis(2));
        let text = s.to_string();
        let row = |w: &str| text.lines().find(|l| l.contains(w)).unwrap_or("");
        // Each row's count (1, right-aligned) ends where the header's
        // "count" does.
        let head = row("operation");
        let Some(at) = head.find("count").map(|i| i + "count".len() - 1) else {
            panic!("no count column: {text}");
        };
        for r in [row("short"), row(long)] {
            assert_eq!(r.as_bytes().get(at), Some(&b'1'), "{text}");
            assert_eq!(r.as_bytes().get(at + 1), Some(&b' '), "{text}");
        }
    }
}
