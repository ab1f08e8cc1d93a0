#!/usr/bin/env python3
"""Self-test for check_rolling.py.

Builds small random inputs, computes a fake "braid output" with a brute-force
pure-Python loop (no DuckDB/Polars), and checks that
  * check_rolling accepts it with both engines, for every closed mode, grouped
    and ungrouped, int64 and timestamp order columns (incl. negative values),
    nulls in values and keys, duplicate ts, W = 0, 1, small, and W larger
    than the span; min/max/count with zero tolerance;
  * deliberately corrupted outputs are reported as failures (exit 1) by each
    engine, and usage errors exit 2.

  python3 tests/oracle/selftest.py [--rows 2000] [--quick] [-v]
Exits 0 when everything passes.
"""

import argparse
import contextlib
import io
import math
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check_rolling  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

AGGS = ["sum", "mean", "min", "max", "count", "std", "var"]
VERBOSE = False
FAILURES = []


# --------------------------------------------------------------------------
# data


def make_input(rows, keys, span, seed, with_id=True, ts_offset=0, null_keys=False, dup_rows=0):
    """Returns (dict of python lists, dict of pyarrow types)."""
    rng = random.Random(seed)
    ts = [rng.randrange(span) + ts_offset for _ in range(rows)]
    key = [rng.randrange(keys) for _ in range(rows)]
    if null_keys:
        key = [None if rng.random() < 0.05 else k for k in key]
    v = [None if rng.random() < 0.05 else round(rng.gauss(0.0, 100.0), 3) for _ in range(rows)]
    # a group where every v is null: key == keys-1 for rows with ts in lowest 10% of span
    for i in range(rows):
        if key[i] == keys - 1 and ts[i] - ts_offset < span // 10:
            v[i] = None
    w = [None if rng.random() < 0.05 else rng.randrange(-1000, 1000) for _ in range(rows)]
    z = [None] * rows  # all-null value column
    cols = {"ts": ts, "key": key, "v": v, "w": w, "z": z}
    types = {"ts": pa.int64(), "key": pa.int64(), "v": pa.float64(), "w": pa.int64(), "z": pa.float64()}
    if with_id:
        ids = list(range(rows))
        rng.shuffle(ids)
        cols = {"id": ids, **cols}
        types = {"id": pa.int64(), **types}
    if dup_rows:
        for name in cols:
            cols[name] = cols[name] + cols[name][:dup_rows]
    return cols, types


def to_table(cols, types):
    return pa.table({c: pa.array(cols[c], types[c]) for c in cols})


def with_timestamp(table, unit):
    i = table.schema.get_field_index("ts")
    return table.set_column(i, "ts", table.column("ts").cast(pa.timestamp(unit)))


# --------------------------------------------------------------------------
# brute force


def brute_force(cols, order, by, values, window, closed, aggs):
    """Per-row aggregates straight from the definition. Returns dict col -> list."""
    n = len(cols[order])
    o = cols[order]
    groups = {}
    for i in range(n):
        groups.setdefault(cols[by][i] if by else 0, []).append(i)
    lo_incl = closed in ("both", "left")
    hi_incl = closed in ("both", "right")
    out = {f"{v}_{a}": [None] * n for v in values for a in aggs}
    for members in groups.values():
        cache = {}
        for i in members:
            t = o[i]
            if t not in cache:
                lo = t - window
                win = [j for j in members
                       if (o[j] >= lo if lo_incl else o[j] > lo) and (o[j] <= t if hi_incl else o[j] < t)]
                res = {}
                for v in values:
                    xs = [cols[v][j] for j in win if cols[v][j] is not None]
                    res.update(aggregate(v, xs, aggs))
                cache[t] = res
            for c, x in cache[t].items():
                out[c][i] = x
    return out


def aggregate(v, xs, aggs):
    k = len(xs)
    r = {}
    for a in aggs:
        c = f"{v}_{a}"
        if a == "count":
            r[c] = k
        elif k == 0:
            r[c] = None
        elif a == "sum":
            r[c] = sum(xs) if isinstance(xs[0], int) else math.fsum(xs)
        elif a == "mean":
            r[c] = math.fsum(xs) / k
        elif a == "min":
            r[c] = min(xs)
        elif a == "max":
            r[c] = max(xs)
        elif a in ("std", "var"):
            if k < 2:
                r[c] = None
            else:
                m = math.fsum(xs) / k
                var = math.fsum((x - m) ** 2 for x in xs) / (k - 1)
                r[c] = var if a == "var" else math.sqrt(var)
    return r


def agg_type(in_type, agg):
    if agg == "count":
        return pa.int64()
    if agg in ("sum", "min", "max") and pa.types.is_integer(in_type):
        return pa.int64()
    return pa.float64()


def write_output(path, table, parts, seed):
    """Shuffle rows; write one file (parts == 0) or a directory of part files."""
    rng = random.Random(seed)
    idx = list(range(table.num_rows))
    rng.shuffle(idx)
    table = table.take(pa.array(idx, pa.int64()))
    if parts == 0:
        pq.write_table(table, path)
        return path
    os.makedirs(path, exist_ok=True)
    cuts = sorted(rng.randrange(table.num_rows + 1) for _ in range(parts - 1))
    bounds = [0] + cuts + [table.num_rows]
    for p in range(parts):
        pq.write_table(table.slice(bounds[p], bounds[p + 1] - bounds[p]),
                       os.path.join(path, f"part-{p:05d}.parquet"))
    with open(os.path.join(path, "_SUCCESS"), "w"):
        pass
    return path


def build_output(in_table, cols, types, order, by, values, window, closed, aggs):
    bf = brute_force(cols, order, by, values, window, closed, aggs)
    out = in_table
    for v in values:
        for a in aggs:
            c = f"{v}_{a}"
            out = out.append_column(c, pa.array(bf[c], agg_type(types[v], a)))
    return out


# --------------------------------------------------------------------------
# running the checker


def run_check(argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = check_rolling.main(argv)
    return rc, buf.getvalue()


def expect(name, argv, want_rc, want_in=()):
    rc, text = run_check(argv)
    good = rc == want_rc and all(s in text for s in want_in)
    if VERBOSE or not good:
        print(f"{'ok  ' if good else 'FAIL'} {name}: rc={rc} (want {want_rc})")
    if not good:
        FAILURES.append(name)
        print("  argv: " + " ".join(argv))
        print("  " + text.replace("\n", "\n  "))
    return text


def cli(inp, outp, order, by, values, window, closed, aggs, extra=()):
    argv = ["--input", inp, "--output", outp, "--order", order, "--values", ",".join(values),
            "--window", str(window), "--closed", closed, "--aggs", ",".join(aggs)]
    if by:
        argv += ["--by", by]
    return argv + list(extra)


# --------------------------------------------------------------------------


def matrix(tmp, rows, quick):
    span = 500
    datasets = [
        # name, with_id, ts_offset, ts unit (None = int64), null_keys, dup_rows
        ("int", True, 0, None, False, 0),
        ("int_negative_nullkeys", True, -250, None, True, 0),
        ("ts_us", True, 0, "us", False, 0),
        ("ts_ms_negative", True, -250, "ms", True, 0),
        ("noid_dups", False, 0, None, True, 25),
    ]
    windows = [0, 1, 2, 7, 60, span - 1, span, span + 10, 10 ** 15]
    if quick:
        windows = [0, 1, 7, span + 10]
    values = ["v", "w", "z"]
    count = 0
    for di, (dname, with_id, off, unit, null_keys, dups) in enumerate(datasets):
        cols, types = make_input(rows, 5, span, seed=100 + di, with_id=with_id, ts_offset=off,
                                 null_keys=null_keys, dup_rows=dups)
        table = to_table(cols, types)
        if unit:
            table = with_timestamp(table, unit)
        inp = os.path.join(tmp, f"in_{dname}.parquet")
        pq.write_table(table, inp)
        for by in (None, "key"):
            for closed in check_rolling.CLOSED:
                for w in windows:
                    out = build_output(table, cols, types, "ts", by, values, w, closed, AGGS)
                    parts = (count % 3) * 2  # 0 = single file, 2 or 4 part files
                    outp = write_output(os.path.join(tmp, f"out_{count}" + ("" if parts else ".parquet")),
                                        out, parts, seed=count)
                    name = f"{dname} by={by} closed={closed} w={w} parts={parts}"
                    # tight tolerance (exact min/max/count: see exact_minmaxcount)
                    expect(name,
                           cli(inp, outp, "ts", by, values, w, closed, AGGS,
                               ["--rtol", "1e-9", "--atol", "1e-9"]),
                           0, ["[duckdb] OK", "[polars] OK", "PASS"])
                    count += 1
    return count


def exact_minmaxcount(tmp, rows):
    """min/max/count compared with zero tolerance (output has only those aggs)."""
    span = 500
    cols, types = make_input(rows, 5, span, seed=7, null_keys=True)
    table = to_table(cols, types)
    inp = os.path.join(tmp, "in_exact.parquet")
    pq.write_table(table, inp)
    aggs = ["min", "max", "count"]
    n = 0
    for by in (None, "key"):
        for closed in check_rolling.CLOSED:
            for w in (0, 1, 3, 40, 10 ** 12):
                out = build_output(table, cols, types, "ts", by, ["v", "w"], w, closed, aggs)
                outp = write_output(os.path.join(tmp, f"exact_{n}.parquet"), out, 0, seed=n)
                expect(f"exact by={by} closed={closed} w={w}",
                       cli(inp, outp, "ts", by, ["v", "w"], w, closed, aggs, ["--rtol", "0", "--atol", "0"]),
                       0, ["[duckdb] OK", "[polars] OK"])
                n += 1


def corruption(tmp, rows):
    span = 500
    cols, types = make_input(rows, 5, span, seed=11)
    table = to_table(cols, types)
    inp = os.path.join(tmp, "in_corrupt.parquet")
    pq.write_table(table, inp)
    values = ["v", "w"]
    w, closed, by = 30, "left", "key"
    good = build_output(table, cols, types, "ts", by, values, w, closed, AGGS)
    args = lambda outp, extra=(): cli(inp, outp, "ts", by, values, w, closed, AGGS, extra)  # noqa: E731
    both_fail = ["[duckdb] FAIL", "[polars] FAIL"]

    p = write_output(os.path.join(tmp, "good.parquet"), good, 0, 1)
    expect("corrupt: baseline passes", args(p), 0, ["PASS"])

    def mutate(colname, fn):
        vals = good.column(colname).to_pylist()
        fn(vals)
        return good.set_column(good.schema.get_field_index(colname), colname,
                               pa.array(vals, good.schema.field(colname).type))

    def first(vals, pred):
        return next(i for i, x in enumerate(vals) if pred(x))

    def perturb(vals):
        i = first(vals, lambda x: x is not None and abs(x) > 1)
        vals[i] = vals[i] * (1 + 1e-4)

    def nullify(vals):
        vals[first(vals, lambda x: x is not None)] = None

    counts = good.column("v_count").to_pylist()
    empty_i = first(counts, lambda c: c == 0)

    def zero_sum_on_empty(vals):  # Polars-style 0 for an empty window
        vals[empty_i] = 0.0

    def off_by_one(vals):
        vals[len(vals) // 2] += 1

    def to_nan(vals):  # NaN where a number is expected (NaN == NaN in Polars)
        vals[first(vals, lambda x: x is not None)] = float("nan")

    def one_value_std(vals):  # population std (0.0) where the sample std is null
        i = next(i for i, c in enumerate(counts) if c == 1)
        vals[i] = 0.0

    cases = [
        ("float agg perturbed 1e-4", mutate("v_mean", perturb), [], ["'v_mean': 1 mismatching"]),
        ("value -> null", mutate("v_max", nullify), [], ["'v_max': 1 mismatching"]),
        ("value -> NaN", mutate("v_max", to_nan), [], ["'v_max': 1 mismatching"]),
        ("sum 0 on empty window", mutate("v_sum", zero_sum_on_empty), [], ["'v_sum': 1 mismatching"]),
        ("count off by one", mutate("w_count", off_by_one), [], ["'w_count': 1 mismatching"]),
        ("std for single value", mutate("v_std", one_value_std), [], ["'v_std': 1 mismatching"]),
        ("int sum perturbed", mutate("w_sum", off_by_one), ["--rtol", "0", "--atol", "0"],
         ["'w_sum': 1 mismatching"]),
        ("ts altered (id join)", mutate("ts", off_by_one), [], ["'ts': 1 mismatching"]),
        ("row dropped", good.slice(1), [], ["1 expected rows missing"]),
        ("row duplicated", pa.concat_tables([good, good.slice(5, 1)]), [], ["1 output rows not in expected"]),
    ]
    for i, (name, tbl, extra, msgs) in enumerate(cases):
        p = write_output(os.path.join(tmp, f"bad_{i}"), tbl, 3, i)
        expect("corrupt: " + name, args(p, extra), 1, both_fail + msgs)

    # schema problems
    p = write_output(os.path.join(tmp, "bad_missing.parquet"), good.drop_columns(["v_var"]), 0, 0)
    expect("corrupt: missing agg column", args(p), 1, ["missing aggregate column 'v_var'"])
    p = write_output(os.path.join(tmp, "bad_extra.parquet"), good.append_column("junk", good.column("w")), 0, 0)
    expect("corrupt: extra column", args(p), 1, ["unexpected extra columns"])
    p = write_output(os.path.join(tmp, "bad_type.parquet"),
                     good.set_column(good.schema.get_field_index("ts"), "ts",
                                     good.column("ts").cast(pa.float64())), 0, 0)
    expect("corrupt: input column type changed", args(p), 1, ["dtype"])
    expect("corrupt: output missing", args(os.path.join(tmp, "nope.parquet")), 1, ["FAIL"])
    os.makedirs(os.path.join(tmp, "emptydir"), exist_ok=True)
    expect("corrupt: empty output dir", args(os.path.join(tmp, "emptydir")), 1, ["no parquet files"])
    # right answer for a different closed mode must fail
    wrong = build_output(table, cols, types, "ts", by, values, w, "both", AGGS)
    p = write_output(os.path.join(tmp, "bad_closed.parquet"), wrong, 0, 0)
    expect("corrupt: closed=both result checked as left", args(p), 1, both_fail)
    wrong = build_output(table, cols, types, "ts", None, values, w, closed, AGGS)
    p = write_output(os.path.join(tmp, "bad_ungrouped.parquet"), wrong, 0, 0)
    expect("corrupt: ungrouped result checked as grouped", args(p), 1, both_fail)

    # no id column: join on all input columns; altering a value = missing + extra
    cols2, types2 = make_input(rows, 5, span, seed=12, with_id=False, dup_rows=10)
    t2 = to_table(cols2, types2)
    inp2 = os.path.join(tmp, "in_noid.parquet")
    pq.write_table(t2, inp2)
    g2 = build_output(t2, cols2, types2, "ts", "key", ["v"], 15, "right", AGGS)
    p = write_output(os.path.join(tmp, "noid_good.parquet"), g2, 0, 0)
    a2 = lambda outp: cli(inp2, outp, "ts", "key", ["v"], 15, "right", AGGS)  # noqa: E731
    expect("noid: baseline passes", a2(p), 0, ["PASS"])
    vv = g2.column("v").to_pylist()
    i = next(i for i, x in enumerate(vv) if x is not None)
    vv[i] += 1.0
    bad = g2.set_column(g2.schema.get_field_index("v"), "v", pa.array(vv, pa.float64()))
    p = write_output(os.path.join(tmp, "noid_bad.parquet"), bad, 0, 0)
    expect("noid: input value altered", a2(p), 1, ["1 expected rows missing", "1 output rows not in expected"])
    p = write_output(os.path.join(tmp, "noid_dupdrop.parquet"), g2.slice(0, g2.num_rows - 1), 0, 0)
    expect("noid: one of duplicated rows dropped", a2(p), 1, ["1 expected rows missing"])

    # usage errors
    gp = os.path.join(tmp, "good.parquet")
    expect("usage: negative window", cli(inp, gp, "ts", by, values, -1, closed, AGGS), 2)
    expect("usage: bad closed", cli(inp, gp, "ts", by, values, 3, "middle", AGGS), 2)
    expect("usage: bad agg", cli(inp, gp, "ts", by, values, 3, closed, ["median"]), 2)
    expect("usage: unknown column", cli(inp, gp, "ts", by, ["nope"], 3, closed, AGGS), 2)
    expect("usage: float order column", cli(inp, gp, "v", None, ["w"], 3, closed, AGGS), 2)
    expect("usage: missing input", cli(os.path.join(tmp, "nope.parquet"), gp, "ts", by, values, 3, closed, AGGS), 2)
    expect("usage: bad engine", cli(inp, gp, "ts", by, values, w, closed, AGGS, ["--engines", "spark"]), 2)
    expect("usage: missing --window", ["--input", inp, "--output", gp, "--order", "ts", "--values", "v",
                                       "--closed", "left", "--aggs", "sum"], 2)

    # the real CLI, as a subprocess
    script = os.path.join(HERE, "check_rolling.py")
    for name, outp, want in (("good", gp, 0), ("bad", os.path.join(tmp, "bad_0"), 1)):
        r = subprocess.run([sys.executable, script] + args(outp), capture_output=True, text=True)
        ok = r.returncode == want
        if VERBOSE or not ok:
            print(f"{'ok  ' if ok else 'FAIL'} subprocess {name}: rc={r.returncode} (want {want})")
        if not ok:
            FAILURES.append("subprocess " + name)
            print(r.stdout, r.stderr)
    r = subprocess.run([sys.executable, script, "--input", inp], capture_output=True, text=True)
    if r.returncode != 2:
        FAILURES.append("subprocess usage")
        print("FAIL subprocess usage error rc", r.returncode, r.stderr)


def main():
    global VERBOSE
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--quick", action="store_true", help="fewer window sizes")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    VERBOSE = a.verbose
    with tempfile.TemporaryDirectory(prefix="braid_oracle_") as tmp:
        corruption(tmp, a.rows)
        exact_minmaxcount(tmp, a.rows)
        n = matrix(tmp, a.rows, a.quick)
    if FAILURES:
        print(f"selftest: {len(FAILURES)} FAILED: {FAILURES[:20]}")
        return 1
    print(f"selftest: all passed ({n} matrix configurations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
