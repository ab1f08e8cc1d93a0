//! Bounded channels between nodes, the lineariser that merges several
//! producers into one ordered stream, and fan-out.
//!
//! A channel yields messages in strictly increasing `seq`; the sender checks
//! it. A full channel makes `send` wait (back pressure). Dropping every
//! receiver makes `send` fail with `Closed`; dropping the sender ends the
//! stream for the receiver.

use crate::message::Message;

/// Why a channel operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The receiving side was dropped before the end of the stream.
    #[error("downstream channel closed before the end of the stream")]
    Closed,
    /// A message's seq was not above the previous one's.
    #[error("message seq {got} is not above the previous seq {prev}")]
    OutOfOrder {
        /// The previous seq.
        prev: u64,
        /// The offending seq.
        got: u64,
    },
}

/// Creates a bounded channel holding at most `capacity` messages (min 1).
pub fn channel(capacity: usize) -> (Sender, Receiver) {
    let (tx, rx) = async_channel::bounded(capacity.max(1));
    (
        Sender {
            inner: tx,
            last_seq: None,
        },
        Receiver { inner: rx },
    )
}

/// The sending end of a channel (one producer).
#[derive(Debug)]
pub struct Sender {
    inner: async_channel::Sender<Message>,
    last_seq: Option<u64>,
}

impl Sender {
    /// Sends `msg`, waiting while the channel is full.
    pub async fn send(&mut self, msg: Message) -> Result<(), ChannelError> {
        if let Some(prev) = self.last_seq {
            if msg.seq <= prev {
                return Err(ChannelError::OutOfOrder { prev, got: msg.seq });
            }
        }
        let seq = msg.seq;
        self.inner
            .send(msg)
            .await
            .map_err(|_| ChannelError::Closed)?;
        self.last_seq = Some(seq);
        Ok(())
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
}

/// The receiving end of a channel.
#[derive(Debug)]
pub struct Receiver {
    inner: async_channel::Receiver<Message>,
}

impl Receiver {
    /// The next message, or `None` at the end of the stream.
    pub async fn recv(&mut self) -> Option<Message> {
        self.inner.recv().await.ok()
    }
}

/// Merges `inputs` (each increasing in seq) into `output` in increasing seq
/// order: a message is forwarded once every still-open input has a message
/// waiting (or has ended), so the smallest seq is known. Equal seqs from
/// different inputs (independent streams that each count from 0, such as
/// two sources) go in input order, each renumbered to one above the seq
/// forwarded before it; inputs whose seqs never meet keep theirs.
pub async fn linearise(mut inputs: Vec<Receiver>, mut output: Sender) -> Result<(), ChannelError> {
    let mut last: Option<u64> = None;
    let mut heads: Vec<Option<Message>> = Vec::with_capacity(inputs.len());
    let mut open: Vec<bool> = vec![true; inputs.len()];
    for _ in 0..inputs.len() {
        heads.push(None);
    }
    loop {
        for i in 0..inputs.len() {
            if open[i] && heads[i].is_none() {
                match inputs[i].recv().await {
                    Some(m) => heads[i] = Some(m),
                    None => open[i] = false,
                }
            }
        }
        let next = heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().map(|m| (m.seq, i)))
            .min();
        match next {
            None => return Ok(()),
            Some((_, i)) => {
                if let Some(mut m) = heads[i].take() {
                    if let Some(prev) = last.filter(|p| m.seq <= *p) {
                        m.seq = prev
                            .checked_add(1)
                            .ok_or(ChannelError::OutOfOrder { prev, got: m.seq })?;
                    }
                    last = Some(m.seq);
                    output.send(m).await?;
                }
            }
        }
    }
}

/// A set of producers whose messages reach one channel in seq order.
pub struct Lineariser;

impl Lineariser {
    /// Makes `n` producer senders (each of `capacity`) that feed `output`
    /// through [`linearise`]; run the returned future to drive it.
    pub fn producers(
        n: usize,
        capacity: usize,
        output: Sender,
    ) -> (
        Vec<Sender>,
        impl std::future::Future<Output = Result<(), ChannelError>> + Send,
    ) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel(capacity)).unzip();
        (txs, linearise(rxs, output))
    }
}

/// Copies every message of `input` to each of `outputs` (cheap clones: the
/// payloads are reference counted). The slowest output sets the pace.
pub async fn fan_out(mut input: Receiver, mut outputs: Vec<Sender>) -> Result<(), ChannelError> {
    while let Some(m) = input.recv().await {
        if let Some((last, rest)) = outputs.split_last_mut() {
            for o in rest {
                o.send(m.clone()).await?;
            }
            last.send(m).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Buffer;
    use crate::message::{PackedData, Payload};

    fn msg(seq: u64) -> Message {
        Message::new(
            seq,
            PackedData {
                metadata: bytes::Bytes::new(),
                data: Buffer::from_vec(seq.to_le_bytes().to_vec()),
            },
        )
    }

    #[tokio::test]
    async fn lineariser_orders_interleaved_producers() {
        let (out_tx, mut out_rx) = channel(4);
        let (mut txs, drive) = Lineariser::producers(3, 2, out_tx);
        let driver = tokio::spawn(drive);
        let mut handles = Vec::new();
        for (p, mut tx) in txs.drain(..).enumerate() {
            handles.push(tokio::spawn(async move {
                for k in 0..50u64 {
                    tx.send(msg(k * 3 + p as u64)).await.unwrap();
                    if k % 7 == p as u64 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        let mut got = Vec::new();
        while let Some(m) = out_rx.recv().await {
            got.push(m.seq);
        }
        for h in handles {
            h.await.unwrap();
        }
        driver.await.unwrap().unwrap();
        assert_eq!(got, (0..150).collect::<Vec<_>>());
    }

    /// Producers that each count from 0 (two sources) merge: ties go in
    /// producer order and are renumbered upwards, nothing is lost, and the
    /// output's seqs increase.
    #[tokio::test]
    async fn lineariser_merges_producers_whose_seqs_meet() {
        let (out_tx, mut out_rx) = channel(4);
        let (txs, drive) = Lineariser::producers(3, 2, out_tx);
        let driver = tokio::spawn(drive);
        for (p, mut tx) in txs.into_iter().enumerate() {
            tokio::spawn(async move {
                for k in 0..20u64 {
                    // Payload: (producer, k); seqs 0.. on every producer.
                    let mut m = msg(p as u64 * 1000 + k);
                    m.seq = k;
                    tx.send(m).await.unwrap();
                }
            });
        }
        let mut got = Vec::new();
        while let Some(m) = out_rx.recv().await {
            let Payload::Packed(p) = &m.payload else {
                panic!("not packed")
            };
            let tag = u64::from_le_bytes(p.data.as_slice().try_into().unwrap());
            got.push((m.seq, tag));
        }
        driver.await.unwrap().unwrap();
        let want: Vec<(u64, u64)> = (0..20u64)
            .flat_map(|k| (0..3u64).map(move |p| p * 1000 + k))
            .enumerate()
            .map(|(i, tag)| (i as u64, tag))
            .collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn sender_rejects_out_of_order_and_closed() {
        let (mut tx, rx) = channel(4);
        tx.send(msg(5)).await.unwrap();
        assert_eq!(
            tx.send(msg(5)).await,
            Err(ChannelError::OutOfOrder { prev: 5, got: 5 })
        );
        drop(rx);
        assert_eq!(tx.send(msg(6)).await, Err(ChannelError::Closed));
    }

    #[tokio::test]
    async fn fan_out_copies() {
        let (mut tx, rx) = channel(2);
        let (a_tx, mut a_rx) = channel(2);
        let (b_tx, mut b_rx) = channel(2);
        let f = tokio::spawn(fan_out(rx, vec![a_tx, b_tx]));
        let p = tokio::spawn(async move {
            for s in 0..10 {
                tx.send(msg(s)).await.unwrap();
            }
        });
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..10 {
            a.push(a_rx.recv().await.unwrap().seq);
            b.push(b_rx.recv().await.unwrap().seq);
        }
        p.await.unwrap();
        f.await.unwrap().unwrap();
        assert_eq!(a, (0..10).collect::<Vec<_>>());
        assert_eq!(a, b);
    }
}
