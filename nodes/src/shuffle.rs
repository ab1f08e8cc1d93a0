//! Hash shuffle of a table: afterwards every row with a given key is on
//! the rank `hash(key) % N`. Chunks are partitioned and sent as they stream
//! in; the shuffle spills to disk over the host memory limit.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;
use braid_coll::{PartitionOwner, Shuffle};
use braid_core::{Context, Payload, Receiver};

use crate::error::{DataError, Result};
use crate::ipc::{pack, unpack};
use crate::partition::{column_index, hash_partition};

/// Shuffles the chunks arriving on `input` by the hash of `keys`; returns
/// this rank's share as one batch.
pub async fn hash_shuffle(
    ctx: &Context,
    schema: SchemaRef,
    keys: &[String],
    mut input: Receiver,
) -> Result<RecordBatch> {
    let n = ctx.nranks();
    let cols: Vec<usize> = keys
        .iter()
        .map(|k| column_index(&schema, k))
        .collect::<Result<_>>()?;
    let shuffle = Shuffle::new(ctx, n, PartitionOwner::RoundRobin, None);
    while let Some(m) = input.recv().await {
        let Payload::Table(t) = m.payload else {
            return Err(DataError::Invalid("shuffle got a non-table message".into()));
        };
        let cols = cols.clone();
        let parts =
            tokio::task::spawn_blocking(move || -> Result<Vec<Option<braid_core::PackedData>>> {
                hash_partition(t.batch(), &cols, n as usize)?
                    .iter()
                    .map(|p| {
                        if p.num_rows() == 0 {
                            Ok(None)
                        } else {
                            pack(p).map(Some)
                        }
                    })
                    .collect()
            })
            .await
            .map_err(|e| DataError::Invalid(e.to_string()))??;
        for (dest, p) in parts.into_iter().enumerate() {
            if let Some(p) = p {
                shuffle.insert(dest as u32, p)?;
            }
        }
    }
    shuffle.insert_finished()?;
    let mine = shuffle.extract(ctx.rank()).await?;
    tokio::task::spawn_blocking(move || -> Result<RecordBatch> {
        let mut parts = Vec::new();
        for p in &mine {
            parts.extend(unpack(p)?);
        }
        Ok(concat_batches(&schema, &parts)?)
    })
    .await
    .map_err(|e| DataError::Invalid(e.to_string()))?
}
