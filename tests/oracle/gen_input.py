#!/usr/bin/env python3
"""Write a random Parquet input for braid's `rolling` binary.

Columns: id (int64, unique), ts (int64 in [0, span), unsorted; or
timestamp[unit] with the same integer storage value when --timestamp is
given), key (int64 in 0..keys-1), v (float64, ~5% nulls), w (int64, ~5% nulls).

  python3 tests/oracle/gen_input.py OUT.parquet --rows 1000000 --keys 100 \
      --span 1000000 --seed 1 [--timestamp [us|ms|ns]]
"""

import argparse
import random
import sys


def make_columns(rows, keys, span, seed, null_frac=0.05):
    rng = random.Random(seed)
    ids = list(range(rows))
    rng.shuffle(ids)
    ts = [rng.randrange(span) for _ in range(rows)]
    key = [rng.randrange(keys) for _ in range(rows)]
    v = [None if rng.random() < null_frac else round(rng.gauss(0.0, 100.0), 3) for _ in range(rows)]
    w = [None if rng.random() < null_frac else rng.randrange(-1000, 1000) for _ in range(rows)]
    return {"id": ids, "ts": ts, "key": key, "v": v, "w": w}


def write(path, cols, timestamp=None):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        pa = None
    if pa is not None:
        ts = pa.array(cols["ts"], pa.int64())
        if timestamp:
            ts = ts.cast(pa.timestamp(timestamp))
        table = pa.table({
            "id": pa.array(cols["id"], pa.int64()),
            "ts": ts,
            "key": pa.array(cols["key"], pa.int64()),
            "v": pa.array(cols["v"], pa.float64()),
            "w": pa.array(cols["w"], pa.int64()),
        })
        pq.write_table(table, path)
        return
    import polars as pl
    df = pl.DataFrame({
        "id": pl.Series(cols["id"], dtype=pl.Int64),
        "ts": pl.Series(cols["ts"], dtype=pl.Int64),
        "key": pl.Series(cols["key"], dtype=pl.Int64),
        "v": pl.Series(cols["v"], dtype=pl.Float64),
        "w": pl.Series(cols["w"], dtype=pl.Int64),
    })
    if timestamp:
        df = df.with_columns(pl.col("ts").cast(pl.Datetime(timestamp)))
    df.write_parquet(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--keys", type=int, default=10)
    p.add_argument("--span", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timestamp", nargs="?", const="us", default=None, choices=["ms", "us", "ns"],
                   help="store ts as timestamp[UNIT] (default unit us)")
    a = p.parse_args(argv)
    if a.rows < 0 or a.keys < 1 or a.span < 1:
        p.error("need rows >= 0, keys >= 1, span >= 1")
    write(a.path, make_columns(a.rows, a.keys, a.span, a.seed), a.timestamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
