"""Polars baseline for `braid-bench rolling`.

Reads a Parquet file, computes the same rolling aggregations as braid's
`rolling` job (window over the order column, closed as given, optionally per
group), writes Parquet, and prints one line:

  POLARS read_s=<s> compute_s=<s> write_s=<s> total_s=<s> peak_rss_mb=<MB> rows=<n>

compute_s includes the sort (the input is unsorted).
"""
import argparse
import resource
import time

import polars as pl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--order", default="ts")
    ap.add_argument("--by")
    ap.add_argument("--values", default="v")
    ap.add_argument("--window", type=int, required=True)
    ap.add_argument("--closed", default="right")
    ap.add_argument("--aggs", default="sum,mean,min,max,count")
    a = ap.parse_args()
    values = a.values.split(",")
    aggs = a.aggs.split(",")

    t0 = time.perf_counter()
    df = pl.read_parquet(a.input)
    t1 = time.perf_counter()
    keys = ([a.by] if a.by else []) + [a.order]
    df = df.sort(keys)
    exprs = []
    for v in values:
        c = pl.col(v)
        for g in aggs:
            e = {
                "sum": c.sum(),
                "mean": c.mean(),
                "min": c.min(),
                "max": c.max(),
                "count": c.count(),
                "std": c.std(),
                "var": c.var(),
            }[g]
            exprs.append(e.alias(f"{v}_{g}"))
    out = df.rolling(index_column=a.order, period=f"{a.window}i", closed=a.closed, group_by=a.by).agg(exprs)
    # rolling returns the group and order columns plus the aggregates, in
    # the sorted order: put the other input columns back next to them.
    rest = [c for c in df.columns if c not in keys]
    out = pl.concat([df.select(rest), out], how="horizontal")
    t2 = time.perf_counter()
    out.write_parquet(a.output, compression="snappy")
    t3 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(
        f"POLARS read_s={t1 - t0:.3f} compute_s={t2 - t1:.3f} write_s={t3 - t2:.3f} "
        f"total_s={t3 - t0:.3f} peak_rss_mb={peak:.0f} rows={out.height}"
    )


if __name__ == "__main__":
    main()
