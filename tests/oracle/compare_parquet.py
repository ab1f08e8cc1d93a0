#!/usr/bin/env python3
"""Compare two outputs of the rolling job (Parquet files or directories of
parts) row by row, matched by the `id` column: same rows, same columns,
equal values (floats within 1e-9 relative), equal nulls. Exit 0 if equal.

  python3 tests/oracle/compare_parquet.py A B
"""

import math
import sys

import pyarrow.dataset as ds


def load(path):
    t = ds.dataset(path, format="parquet").to_table()
    return t.sort_by("id")


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    if a.num_rows != b.num_rows:
        sys.exit(f"rows differ: {a.num_rows} vs {b.num_rows}")
    if sorted(a.column_names) != sorted(b.column_names):
        sys.exit(f"columns differ: {a.column_names} vs {b.column_names}")
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        for i, (p, q) in enumerate(zip(x, y)):
            if p is None or q is None:
                if p is not q:
                    sys.exit(f"{name} row {i}: {p} vs {q}")
            elif isinstance(p, float) or isinstance(q, float):
                if not (math.isclose(p, q, rel_tol=1e-9, abs_tol=1e-9) or (p != p and q != q)):
                    sys.exit(f"{name} row {i}: {p} vs {q}")
            elif p != q:
                sys.exit(f"{name} row {i}: {p} vs {q}")
    print(f"equal: {a.num_rows} rows, {len(a.column_names)} columns")


main()
