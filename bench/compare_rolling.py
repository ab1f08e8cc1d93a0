"""Checks that `braid-bench rolling`'s two jobs computed the same thing:
braid's output (a directory of Parquet parts) against Polars' (one Parquet
file), rows matched by `id`.

Same rows and columns; equal nulls; integers equal; floats equal or
within 1e-9 relative (+ 1e-9 absolute; 1e-6 for std and var). One documented difference is allowed: a
window with no non-null value gives a null sum in braid (as in DuckDB and
DESIGN.md), 0 in Polars (up to its running sum's residue); there
braid's `<v>_sum` must be null, Polars' within 1e-6 of 0, and (where counted) `<v>_count` 0. Prints one line; exit 1 at the first
difference.

  python3 bench/compare_rolling.py BRAID_DIR POLARS_FILE
"""
import sys

import polars as pl


def main():
    a = pl.read_parquet(f"{sys.argv[1]}/*.parquet").sort("id")
    b = pl.read_parquet(sys.argv[2]).sort("id")
    if a.height != b.height:
        sys.exit(f"rows differ: braid {a.height}, Polars {b.height}")
    if sorted(a.columns) != sorted(b.columns):
        sys.exit(f"columns differ: braid {a.columns}, Polars {b.columns}")
    if not a["id"].equals(b["id"]):
        sys.exit("the id columns differ")
    empty_sums = 0
    for name in a.columns:
        x, y = a[name], b[name]
        ok_null = x.is_null() == y.is_null()
        if name.endswith("_sum"):
            # braid null where Polars sums an empty window to 0 (up to the
            # residue its running add-and-subtract sum leaves).
            empty = x.is_null() & (y.abs() <= 1e-6).fill_null(False)
            count = name[: -len("_sum")] + "_count"
            if count in a.columns:
                empty = empty & (a[count] == 0)
            empty_sums += int(empty.sum())
            ok_null = ok_null | empty
        if not ok_null.all():
            i = int((~ok_null).arg_max())
            sys.exit(f"{name}: nulls differ at id {a['id'][i]}: braid {x[i]}, Polars {y[i]}")
        both = x.is_not_null() & y.is_not_null()
        xs, ys = x.filter(both), y.filter(both)
        if x.dtype.is_float() or y.dtype.is_float():
            xs, ys = xs.cast(pl.Float64), ys.cast(pl.Float64)
            # Polars' running sums of squares lose more digits than its
            # running sums: a looser bound for std and var.
            rel = 1e-6 if name.endswith(("_std", "_var")) else 1e-9
            close = ((xs - ys).abs() <= rel * (1.0 + ys.abs())) | (xs.is_nan() & ys.is_nan()) | (xs == ys)
        else:
            close = xs == ys
        if not close.all():
            i = int((~close).arg_max())
            sys.exit(f"{name}: values differ: braid {xs[i]}, Polars {ys[i]}")
    print(
        f"outputs agree: {a.height} rows, {len(a.columns)} columns"
        f" ({empty_sums} empty-window sums: null in braid, 0 in Polars)"
    )


main()
