//! Hash shuffle of a table: afterwards every row with a given key is on
//! the rank `hash(key) % N`. Chunks are partitioned and sent as they stream
//! in; the shuffle spills to disk over the host memory limit. Each rank's
//! own share never leaves it (no packing, no copy).

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use braid_coll::{PartitionOwner, Shuffle};
use braid_core::{Context, PackedData, Payload, Receiver};

use crate::error::{DataError, Result};
use crate::ipc::{pack, unpack};
use crate::partition::{column_index, hash_partition};

/// Shuffles the chunks arriving on `input` by the hash of `keys`; returns
/// this rank's share as batches.
pub async fn hash_shuffle(
    ctx: &Context,
    schema: SchemaRef,
    keys: &[String],
    mut input: Receiver,
) -> Result<Vec<RecordBatch>> {
    let n = ctx.nranks();
    let me = ctx.rank() as usize;
    let cols: Vec<usize> = keys
        .iter()
        .map(|k| column_index(&schema, k))
        .collect::<Result<_>>()?;
    let mut own: Vec<RecordBatch> = Vec::new();
    let shuffle = Shuffle::new(ctx, n, PartitionOwner::RoundRobin, None);
    while let Some(m) = input.recv().await {
        let Payload::Table(t) = m.payload else {
            return Err(DataError::Invalid("shuffle got a non-table message".into()));
        };
        let cols = cols.clone();
        type Split = (Vec<Option<PackedData>>, RecordBatch);
        let (parts, mine) = tokio::task::spawn_blocking(move || -> Result<Split> {
            let mut split = hash_partition(t.batch(), &cols, n as usize)?;
            let mine = std::mem::replace(&mut split[me], t.batch().slice(0, 0));
            let packed = split
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
            own.push(mine);
        }
        for (dest, p) in parts.into_iter().enumerate() {
            if let Some(p) = p {
                shuffle.insert(dest as u32, p)?;
            }
        }
    }
    shuffle.insert_finished()?;
    let mine = shuffle.extract(ctx.rank()).await?;
    drop(shuffle);
    tokio::task::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
        let mut parts = own;
        for p in mine {
            parts.extend(unpack(&p)?);
        }
        Ok(parts)
    })
    .await
    .map_err(|e| DataError::Invalid(e.to_string()))?
}
