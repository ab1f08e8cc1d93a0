//! Hash shuffle of a table: afterwards every row with a given key is on
//! the rank `hash(key) % N`. Chunks are partitioned and sent as they stream
//! in; the shuffle spills to disk over the host memory limit. Each rank's
//! own share never leaves it (no packing, no copy) while it fits under the
//! limit (it is charged to the host memory like the parts received); a
//! part that does not fit is packed and goes through the shuffle's store,
//! which spills it.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use braid_coll::{PartitionOwner, Shuffle};
use braid_core::{Context, MemoryType, PackedData, Payload, Receiver, Reservation};

use crate::error::{DataError, Result};
use crate::ipc::{pack, unpack};
use crate::partition::{check_columns, column_index, hash_partition};

/// A shuffle of record batches to ranks: each batch is split into one part
/// per rank; other ranks' parts are packed and sent at once, this rank's part
/// stays as it is.
pub(crate) struct TableShuffle {
    ctx: Context,
    /// The columns every part has (a peer's parts are checked against it).
    schema: SchemaRef,
    shuffle: Shuffle,
    own: Vec<RecordBatch>,
    /// The host memory `own` holds, charged until the shuffle ends.
    own_charge: Vec<Reservation>,
}

impl TableShuffle {
    /// A new shuffle over the ranks of `ctx` of batches with `schema`.
    pub(crate) fn new(ctx: &Context, schema: SchemaRef) -> Self {
        TableShuffle {
            ctx: ctx.clone(),
            schema,
            shuffle: Shuffle::new(ctx, ctx.nranks(), PartitionOwner::RoundRobin, None),
            own: Vec::new(),
            own_charge: Vec::new(),
        }
    }

    /// Inserts the parts `split` makes (part r goes to rank r); the split
    /// and the packing run off the runtime's threads.
    pub(crate) async fn insert<F>(&mut self, split: F) -> Result<()>
    where
        F: FnOnce() -> Result<Vec<RecordBatch>> + Send + 'static,
    {
        let me = self.ctx.rank() as usize;
        type Split = (Vec<Option<PackedData>>, RecordBatch);
        let (parts, mine) = tokio::task::spawn_blocking(move || -> Result<Split> {
            let mut parts = split()?;
            let empty = parts.first().map(|p| p.slice(0, 0));
            let mine = match (parts.get_mut(me), empty) {
                (Some(m), Some(e)) => std::mem::replace(m, e),
                _ => {
                    return Err(DataError::Invalid(
                        "a split must make one part per rank".into(),
                    ));
                }
            };
            let packed = parts
                .iter()
                .map(|p| {
                    if p.num_rows() == 0 {
                        Ok(None)
                    } else {
                        pack(p).map(Some)
                    }
                })
                .collect::<Result<_>>()?;
            Ok((packed, mine))
        })
        .await
        .map_err(|e| DataError::Invalid(e.to_string()))??;
        if mine.num_rows() > 0 {
            let size = mine.get_array_memory_size() as u64;
            match self
                .ctx
                .resource()
                .reserve_or_fail(size, &[MemoryType::Host])
            {
                Ok(r) => {
                    self.own_charge.push(r);
                    self.own.push(mine);
                }
                // Over the limit: packed, into the shuffle's store (which
                // spills it) as a part sent to this rank.
                Err(_) => {
                    let p = tokio::task::spawn_blocking(move || pack(&mine))
                        .await
                        .map_err(|e| DataError::Invalid(e.to_string()))??;
                    self.shuffle.insert(me as u32, p)?;
                }
            }
        }
        for (dest, p) in parts.into_iter().enumerate() {
            if let Some(p) = p {
                self.shuffle.insert(dest as u32, p)?;
            }
        }
        Ok(())
    }

    /// Ends this rank's inserts and returns every part sent to it.
    pub(crate) async fn finish(self) -> Result<Vec<RecordBatch>> {
        self.shuffle.insert_finished()?;
        let mine = self.shuffle.extract(self.ctx.rank()).await?;
        drop(self.shuffle);
        let (own, schema, charge) = (self.own, self.schema, self.own_charge);
        tokio::task::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
            let mut parts = own;
            for p in mine {
                parts.extend(unpack(&p, &schema)?);
            }
            // Handed on: no longer the shuffle's to account.
            drop(charge);
            Ok(parts)
        })
        .await
        .map_err(|e| DataError::Invalid(e.to_string()))?
    }
}

/// Shuffles the chunks arriving on `input` by the hash of `keys`; returns
/// this rank's share as batches.
pub async fn hash_shuffle(
    ctx: &Context,
    schema: SchemaRef,
    keys: &[String],
    mut input: Receiver,
) -> Result<Vec<RecordBatch>> {
    let n = ctx.nranks() as usize;
    if keys.is_empty() {
        return Err(DataError::Invalid(
            "a hash shuffle needs at least one key column".into(),
        ));
    }
    let cols: Vec<usize> = keys
        .iter()
        .map(|k| column_index(&schema, k))
        .collect::<Result<_>>()?;
    let mut shuffle = TableShuffle::new(ctx, schema.clone());
    while let Some(m) = input.recv().await {
        let Payload::Table(t) = m.payload else {
            return Err(DataError::Invalid("shuffle got a non-table message".into()));
        };
        check_columns("hash shuffle", &schema, t.batch())?;
        let cols = cols.clone();
        shuffle
            .insert(move || hash_partition(t.batch(), &cols, n))
            .await?;
    }
    shuffle.finish().await
}
