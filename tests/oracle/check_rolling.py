#!/usr/bin/env python3
"""Oracle for braid's `rolling` binary.

Recomputes a rolling-window aggregation independently with DuckDB (SQL window
functions over RANGE frames) and with Polars (DataFrame.rolling), then compares
each expected table with braid's Parquet output.

Usage:
  python3 tests/oracle/check_rolling.py --input IN.parquet --output OUT \
      --order ts [--by key] --values v1,v2 (--window W | --period P) \
      --closed right|both|left|none --aggs sum,mean,min,max,count,std,var \
      [--engines duckdb,polars] [--rtol 1e-6] [--atol 1e-6] [--show N]

OUT is one Parquet file or a directory of `part-*.parquet` files (if the
directory holds no `part-*.parquet`, every `*.parquet` in it is read).

Semantics (t = the row's order value, w = window, integer in the order
column's storage unit; timestamps are converted to integer epoch units, dates
to days since the epoch):
  closed=right: t-w <  ts <= t      closed=both: t-w <= ts <= t
  closed=left:  t-w <= ts <  t      closed=none: t-w <  ts <  t
The window holds rows of the same key (null keys form one group of their
own), rows with equal ts share one window, nulls in values are skipped,
count counts non-null values (0 for an empty window), every other agg is null
when the window holds no non-null value, std/var are sample (ddof=1) and null
below two values. NaN: min and max skip it unless the window holds nothing
else (as Polars' rolling min/max do; DuckDB orders NaN above every number, so
its min/max are computed with NaN as null, falling back to NaN); sums, means
and variances with a NaN are NaN everywhere.

--period P (instead of --window) is a calendar window on a date or timestamp
column, in Polars' form (1mo, 2q, 1y, 1mo15d, 1y6mo12h): t - P steps back P's
months on the calendar (the day clamped to the month's end), then the rest,
as DuckDB's `ts - INTERVAL` does. DuckDB takes each row's t - P as it is.
Polars' rolling keeps its window start from moving back, which differs from
that where a clamped month end makes a later row's t - P lie below an
earlier row's (2023-03-30 23:00 and 2023-03-31 01:00 both step back to
2023-02-28); such inputs are checked with DuckDB only, and Polars says SKIP.
DuckDB intervals stop at microseconds: nanosecond columns are checked with
Polars only. On a timestamp column in UTC, --period steps as without a zone
(months first, then the rest): DuckDB's TIMESTAMPTZ arithmetic takes the
time part first (2024-03-31 06:00 - 1 month 12 hours is 02-29 18:00 there,
02-28 18:00 in its TIMESTAMP arithmetic and in Polars), so DuckDB gets such
a column without its zone. On a timestamp column in a time zone other than UTC, --period's
days, weeks and months step on the zone's local clock (RFC 5545, Polars'
rolling): a repeated local time keeps the offset the step started from, a
skipped one is read with the offset before the gap, hours and below are
absolute. DuckDB's ICU arithmetic differs there (the later instant; the time
part first), so DuckDB gets each row's edge from Polars' `offset_by` and
evaluates the row's own window (where Polars' rolling, which keeps its start
from moving back, is skipped as above).

Output columns: every input column, plus `<value>_<agg>` for each value/agg.
Rows are matched on the column `id` when the input has a unique non-null `id`
column (other input columns are then compared exactly), otherwise on all input
columns. Output row order does not matter.

Exit status: 0 all engines agree with the output, 1 mismatch (or the output is
missing/unreadable), 2 usage error.

Needs: pip install duckdb polars pyarrow  (tested with duckdb 2.0.0,
polars 2.1.0, pyarrow 26.0.1). Self-test: python3 tests/oracle/selftest.py
"""

import argparse
import glob
import os
import sys
import time

AGGS = ("sum", "mean", "min", "max", "count", "std", "var")
CLOSED = ("right", "both", "left", "none")
ENGINES = ("duckdb", "polars")
ID_COL = "id"

RID = "__rid"  # row index of the input, internal
ORD = "__o"  # integer order value, internal
DUP = "__dup"  # occurrence number among rows with equal join keys
IN_E = "__in_expected"
IN_A = "__in_actual"
ACT = "__act"  # suffix of braid's columns after the join


class UsageError(Exception):
    pass


class OutputError(Exception):
    pass


class SkipEngine(Exception):
    """This engine cannot compute the case as braid defines it (the reason)."""


def _import_polars():
    try:
        import polars as pl
    except ImportError as e:  # pragma: no cover
        raise UsageError(f"polars is required ({e}); pip install polars pyarrow duckdb")
    return pl


# --------------------------------------------------------------------------
# argument handling


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Check braid rolling-window output against DuckDB and Polars.")
    p.add_argument("--input", required=True, help="input Parquet file (or directory of parts)")
    p.add_argument("--output", required=True, help="braid output: Parquet file or directory of part-*.parquet")
    p.add_argument("--order", required=True, help="order column (integer, date or timestamp)")
    p.add_argument("--by", default=None, help="optional group columns, comma-separated")
    p.add_argument("--values", required=True, help="comma-separated value columns")
    w = p.add_mutually_exclusive_group(required=True)
    w.add_argument("--window", type=int, help="window length, >= 0, in order-column units")
    w.add_argument("--period", help="calendar window on a date or timestamp column, as Polars writes it (1mo, 1q, 1y, 1mo15d)")
    p.add_argument("--closed", required=True, choices=CLOSED)
    p.add_argument("--aggs", required=True, help="comma-separated subset of " + ",".join(AGGS))
    p.add_argument("--engines", default="duckdb,polars", help="comma-separated subset of duckdb,polars")
    p.add_argument("--rtol", type=float, default=1e-6)
    p.add_argument("--atol", type=float, default=1e-6)
    p.add_argument("--show", type=int, default=10, help="mismatching rows to print (default 10)")
    a = p.parse_args(argv)

    def split(s):
        return [x.strip() for x in s.split(",") if x.strip()]

    a.values = split(a.values)
    a.aggs = split(a.aggs)
    a.engines = split(a.engines)
    if not a.values:
        p.error("--values is empty")
    if not a.aggs:
        p.error("--aggs is empty")
    bad = [x for x in a.aggs if x not in AGGS]
    if bad:
        p.error(f"unknown aggs {bad}; choose from {','.join(AGGS)}")
    bad = [x for x in a.engines if x not in ENGINES]
    if bad or not a.engines:
        p.error(f"bad --engines {a.engines}; choose from {','.join(ENGINES)}")
    if len(set(a.values)) != len(a.values) or len(set(a.aggs)) != len(a.aggs):
        p.error("duplicate entries in --values or --aggs")
    if a.window is not None and a.window < 0:
        p.error("--window must be >= 0")
    if a.period is not None:
        try:
            a.interval = duckdb_interval(a.period)
        except ValueError as e:
            p.error(str(e))
    if a.rtol < 0 or a.atol < 0:
        p.error("--rtol/--atol must be >= 0")
    return a


# Polars duration units and their DuckDB interval parts (months, quarters
# and years as months; DuckDB has no nanoseconds).
_PERIOD_UNITS = {"mo": (1, "month"), "q": (3, "month"), "y": (12, "month"), "w": (7, "day"),
                 "d": (1, "day"), "h": (1, "hour"), "m": (1, "minute"), "s": (1, "second"),
                 "ms": (1, "millisecond"), "us": (1, "microsecond"), "ns": (1, "nanosecond")}


def period_units(period):
    import re
    return [u for _, u in re.findall(r"(\d+)(mo|ms|us|ns|q|y|w|d|h|m|s)", period)]


def duckdb_interval(period):
    """A Polars duration (`1mo15d`) as a DuckDB interval literal's text
    (`1 month 15 day`); `ns` terms are kept as `nanosecond`, which only a
    caller that skips DuckDB may see."""
    import re
    terms = re.findall(r"(\d+)(mo|ms|us|ns|q|y|w|d|h|m|s)", period)
    if not terms or "".join(n + u for n, u in terms) != period:
        raise ValueError(f"--period {period!r}: expected terms like 1mo, 2q, 1y, 15d, 12h")
    parts = {}
    for n, u in terms:
        k, name = _PERIOD_UNITS[u]
        parts[name] = parts.get(name, 0) + int(n) * k
    return " ".join(f"{v} {k}" for k, v in parts.items())


def parquet_files(path, what, default_glob):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, default_glob)))
        if not files:
            files = sorted(glob.glob(os.path.join(path, "*.parquet")))
        return files
    if os.path.isfile(path):
        return [path]
    raise FileNotFoundError(f"{what} not found: {path}")


def read_parquet(pl, files):
    frames = [pl.read_parquet(f) for f in files]
    if len(frames) == 1:
        return frames[0]
    return pl.concat(frames, how="vertical")


# --------------------------------------------------------------------------
# input preparation


class Spec:
    """Everything both engines need, derived from the arguments and the input."""

    def __init__(self, args, base, pl):
        self.order = args.order
        self.by = [c for c in args.by.split(",") if c] if args.by else []
        self.values = args.values
        self.aggs = args.aggs
        self.closed = args.closed
        self.window = args.window
        self.period = args.period
        self.interval = getattr(args, "interval", None)
        self.input_cols = [c for c in base.columns if c != RID]
        self.agg_cols = [f"{v}_{a}" for v in self.values for a in self.aggs]

        cols = set(self.input_cols)
        for c in [self.order] + self.by + self.values:
            if c not in cols:
                raise UsageError(f"column {c!r} not in input (columns: {self.input_cols})")
        for c in self.input_cols:
            if c.startswith("__"):
                raise UsageError(f"input column {c!r}: names starting with '__' are reserved by the checker")
        clash = [c for c in self.agg_cols if c in cols]
        if clash:
            raise UsageError(f"aggregate column names clash with input columns: {clash}")
        named = [self.order] + self.by + self.values
        if len(set(named)) != len(named):
            raise UsageError("order, group and value columns must be distinct")

        dt = base.schema[self.order]
        if dt.is_integer():
            self.unit = None
        elif isinstance(dt, pl.Datetime):
            self.unit = dt.time_unit  # 'ms' | 'us' | 'ns'
        elif dt == pl.Date:
            self.unit = "d"  # days since the epoch
        else:
            raise UsageError(f"order column {self.order!r} has dtype {dt}; need an integer, a date or a timestamp")
        if self.period is not None and self.unit is None:
            raise UsageError(f"--period needs a date or timestamp order column; {self.order!r} is {dt}")
        # A zone other than UTC: --period's days, weeks and months step on
        # its local clock (Polars' rolling; see the module doc).
        self.zone = dt.time_zone if isinstance(dt, pl.Datetime) and dt.time_zone not in (None, "UTC") else None
        self.utc = isinstance(dt, pl.Datetime) and dt.time_zone == "UTC"
        if base[self.order].null_count():
            raise UsageError(f"order column {self.order!r} holds nulls; semantics unspecified")
        for v in self.values:
            vdt = base.schema[v]
            if not (vdt.is_integer() or vdt.is_float() or isinstance(vdt, pl.Decimal)):
                raise UsageError(f"value column {v!r} has dtype {vdt}; need an integer, float or decimal")

        # Window lower bound that already covers every row can be replaced by
        # "unbounded" without changing the result; avoids t - w overflow in the
        # engines for huge windows.
        # Windows are translation-invariant: both engines see the order value
        # minus its minimum, so t - w cannot leave i64 for data near its ends
        # (DuckDB raises, Polars wraps).
        self.shift = 0
        if base.height:
            o = base.select(self.raw_ord_expr(pl)).to_series()
            self.ord_span = int(o.max()) - int(o.min())
            if self.ord_span < 2**63:
                self.shift = int(o.min())
        else:
            self.ord_span = 0
        if self.period is not None:
            # Calendar arithmetic needs the real dates: no shift, no cap.
            self.shift = 0
            self.unbounded = False
            self.empty = False
        else:
            self.unbounded = self.window > self.ord_span
            self.capped_window = self.ord_span + 1 if self.unbounded else self.window
            w = self.window
            self.empty = (self.closed in ("right", "left") and w == 0) or (self.closed == "none" and w <= 1)

        ids = base[ID_COL] if ID_COL in cols else None
        if ids is not None and ids.null_count() == 0 and ids.n_unique() == base.height:
            self.join_cols = [ID_COL]
        else:
            self.join_cols = list(self.input_cols)

    def raw_ord_expr(self, pl):
        if self.unit is None:
            return pl.col(self.order).cast(pl.Int64).alias(ORD)
        if self.unit == "d":
            return pl.col(self.order).cast(pl.Int32).cast(pl.Int64).alias(ORD)
        return pl.col(self.order).dt.epoch(self.unit).alias(ORD)

    def ord_expr(self, pl):
        """The order value minus its minimum (see `shift`); with --period the
        date or timestamp itself."""
        if self.period is not None:
            return pl.col(self.order).alias(ORD)
        return (self.raw_ord_expr(pl) - pl.lit(self.shift, pl.Int64)).alias(ORD)

    def keys(self):
        return list(self.by)


# --------------------------------------------------------------------------
# engines


def qi(name):
    return '"' + name.replace('"', '""') + '"'


def expected_duckdb(spec, base, pl):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads TO {os.cpu_count() or 1}")
    # The order value as an integer comes from Polars: DuckDB 2.0's
    # epoch_ms/epoch_ns refuse TIMESTAMP_MS/TIMESTAMP_NS columns.
    local = spec.zone is not None and any(u in ("mo", "q", "y", "w", "d") for u in period_units(spec.period or ""))
    if local:
        # Local-clock steps: DuckDB's ICU arithmetic takes a repeated local
        # time as the later instant and the time part before the days, where
        # Polars (and braid) keep the offset the step started from and take
        # the days first. So each row's edge comes from Polars' offset_by,
        # and DuckDB evaluates every row's own window over integers.
        t = spec.raw_ord_expr(pl)
        start = pl.col(spec.order).dt.offset_by("-" + spec.period).dt.epoch(spec.unit)
        src = base.select([RID] + spec.keys() + spec.values + [t, (t - start).alias("__delta")])
    else:
        o = spec.ord_expr(pl)
        if spec.period is not None and spec.utc:
            # In UTC the calendar is the column's own, as without a zone;
            # but DuckDB's TIMESTAMPTZ arithmetic (ICU) takes a period's
            # time part before its months (2024-03-31 06:00 - 1 month 12
            # hours: 02-29 18:00), where its TIMESTAMP arithmetic, Polars'
            # offset_by (zone or not) and braid take the months first
            # (02-28 18:00). DuckDB gets the same instants without a zone.
            o = o.dt.replace_time_zone(None)
        src = base.select([RID] + spec.keys() + spec.values + [o])
    con.register("braid_input", src.to_arrow())

    w = spec.window
    empty = None  # rows whose window is empty whatever the frame says
    if local:
        # t - delta <= ts, or t - delta < ts  <=>  t - (delta - 1) <= ts; a
        # delta of 0 with an open lower end (a skipped local day) is empty.
        if spec.closed in ("both", "left"):
            lower = "__delta PRECEDING"
        else:
            lower = "greatest(__delta - 1, 0) PRECEDING"
            empty = "__delta = 0"
    elif spec.period is not None:
        if spec.unit == "ns":
            raise SkipEngine("DuckDB intervals stop at microseconds")
        one = {"d": "1 day", "s": "1 second", "ms": "1 millisecond", "us": "1 microsecond"}[spec.unit]
        finer = {"d": ("h", "m", "s", "ms", "us", "ns"), "s": ("ms", "us", "ns"), "ms": ("us", "ns"),
                 "us": ("ns",)}[spec.unit]
        if any(u in finer for u in period_units(spec.period)):
            # t - P + 1 unit <= ts only stands for t - P < ts when t - P
            # is a whole number of the column's units.
            raise SkipEngine(f"--period {spec.period} is finer than the column's unit")
        iv = f"INTERVAL '{spec.interval}'"
        # t - P < ts  <=>  t - P + 1 unit <= ts (months first, then the rest)
        lower = f"{iv} PRECEDING" if spec.closed in ("both", "left") else f"({iv} - INTERVAL '{one}') PRECEDING"
        upper = "CURRENT ROW" if spec.closed in ("both", "right") else f"INTERVAL '{one}' PRECEDING"
    elif spec.unbounded:
        lower = "UNBOUNDED PRECEDING"
    elif spec.closed in ("both", "left"):
        lower = f"{w} PRECEDING"  # t - w <= ts
    else:
        lower = f"{w - 1} PRECEDING"  # t - w < ts  <=>  t - (w-1) <= ts  (integers)
    if spec.period is None or local:
        upper = "CURRENT ROW" if spec.closed in ("both", "right") else "1 PRECEDING"
    part = f"PARTITION BY {', '.join(qi(b) for b in spec.by)} " if spec.by else ""
    window = f"({part}ORDER BY {ORD} RANGE BETWEEN {lower} AND {upper})"

    def nan_last(fn, c):
        # NaN loses against any number (braid, Polars' rolling min/max);
        # DuckDB orders NaN above every number, so NaN is taken as null
        # here, and is the result only when the window holds nothing else.
        x = f"CAST({c} AS DOUBLE)"
        return (f"coalesce({fn}(CASE WHEN isnan({x}) THEN NULL ELSE {x} END) OVER win, "
                f"CASE WHEN count({c}) OVER win > 0 THEN CAST('NaN' AS DOUBLE) END)")

    sel = [RID]
    for v in spec.values:
        c = qi(v)
        for a in spec.aggs:
            out = qi(f"{v}_{a}")
            if spec.empty:
                expr = "CAST(0 AS BIGINT)" if a == "count" else "CAST(NULL AS DOUBLE)"
            else:
                fn = {
                    "sum": f"CAST(sum({c}) OVER win AS DOUBLE)",
                    "mean": f"avg({c}) OVER win",
                    "min": nan_last("min", c),
                    "max": nan_last("max", c),
                    "count": f"count({c}) OVER win",
                    "std": f"stddev_samp({c}) OVER win",
                    "var": f"var_samp({c}) OVER win",
                }[a]
                expr = fn
            if empty is not None:
                expr = f"CASE WHEN {empty} THEN {'0' if a == 'count' else 'NULL'} ELSE {expr} END"
            sel.append(f"{expr} AS {out}")
    sql = f"SELECT {', '.join(sel)} FROM braid_input"
    if not spec.empty:
        sql += f" WINDOW win AS {window}"
    res = con.sql(sql).pl()
    con.close()
    res = res.with_columns(pl.col(RID).cast(base.schema[RID]))
    return base.join(res, on=RID, how="left")


def expected_polars(spec, base, pl):
    keys = spec.keys()
    # Values as f64, as braid computes them: Polars sums an int32 column in
    # int32 and wraps on overflow.
    df = base.select(keys + [pl.col(v).cast(pl.Float64) for v in spec.values] + [spec.ord_expr(pl)])
    cnt = {v: f"__cnt_{i}" for i, v in enumerate(spec.values)}
    exprs = []
    for v in spec.values:
        c = pl.col(v)
        exprs.append(c.count().alias(cnt[v]))
        for a in spec.aggs:
            e = {
                "sum": c.sum(),
                "mean": c.mean(),
                "min": c.min(),
                "max": c.max(),
                "count": c.count(),
                "std": c.std(ddof=1),
                "var": c.var(ddof=1),
            }[a]
            exprs.append(e.alias(f"{v}_{a}"))

    if spec.empty:
        res = df.select(keys + [ORD]).unique().with_columns(
            [pl.lit(0, pl.Int64).alias(cnt[v]) for v in spec.values]
            + [(pl.lit(0, pl.Int64) if a == "count" else pl.lit(None, pl.Float64)).alias(f"{v}_{a}")
               for v in spec.values for a in spec.aggs])
    elif spec.period is not None:
        srt = df.sort(keys + [ORD])
        start = srt.select(keys + [pl.col(ORD).dt.offset_by("-" + spec.period).alias("__start")])
        back = start.select(
            (pl.col("__start").diff().over(keys) < pl.duration(microseconds=0)).any()
            if keys else (pl.col("__start").diff() < pl.duration(microseconds=0)).any()).item()
        if back:
            raise SkipEngine("a later row's window start lies below an earlier row's (a clamped month "
                             "end, or a change of the zone's offset); Polars' rolling keeps its start "
                             "from moving back")
        res = (srt.rolling(index_column=ORD, period=spec.period, closed=spec.closed, group_by=keys or None)
               .agg(exprs)
               .unique(subset=keys + [ORD], keep="any"))
    elif spec.window == 0:  # closed=both, w=0: only the row's peers (Polars rejects period 0)
        res = df.group_by(keys + [ORD]).agg(exprs)
    else:
        res = (df.sort(keys + [ORD])
               .rolling(index_column=ORD, period=f"{spec.capped_window}i",
                        closed=spec.closed, group_by=keys or None)
               .agg(exprs)
               .unique(subset=keys + [ORD], keep="any"))

    fixes = []
    for v in spec.values:
        n = pl.col(cnt[v])
        for a in spec.aggs:
            col = f"{v}_{a}"
            if a == "count":
                fixes.append(pl.col(col).cast(pl.Int64))
            else:
                need = 2 if a in ("std", "var") else 1
                fixes.append(pl.when(n >= need).then(pl.col(col)).otherwise(None).alias(col))
    res = res.with_columns(fixes).drop(list(cnt.values()))
    left = base.with_columns(spec.ord_expr(pl))
    out = left.join(res, on=keys + [ORD], how="left", nulls_equal=True).drop(ORD)
    if out.height != base.height:
        raise RuntimeError("internal error: polars expected table changed row count")
    return out


# --------------------------------------------------------------------------
# comparison


def check_schema(spec, base, actual, pl):
    problems = []
    acols = set(actual.columns)
    for c in spec.input_cols:
        if c not in acols:
            problems.append(f"missing input column {c!r}")
        elif actual.schema[c] != base.schema[c]:
            problems.append(f"input column {c!r} has dtype {actual.schema[c]}, input has {base.schema[c]}")
    for c in spec.agg_cols:
        if c not in acols:
            problems.append(f"missing aggregate column {c!r}")
        else:
            dt = actual.schema[c]
            if not (dt.is_integer() or dt.is_float() or dt == pl.Null):
                problems.append(f"aggregate column {c!r} has non-numeric dtype {dt}")
    extra = [c for c in actual.columns if c not in set(spec.input_cols) | set(spec.agg_cols)]
    if extra:
        problems.append(f"unexpected extra columns {extra}")
    return problems


def fmt(x):
    if isinstance(x, float):
        return repr(x)
    return str(x)


def compare(spec, expected, actual, rtol, atol, show, pl):
    """Returns (ok, lines, stats)."""
    jc = spec.join_cols
    other_in = [c for c in spec.input_cols if c not in jc]
    dup = pl.int_range(pl.len()).over(jc).alias(DUP)
    e = expected.drop(RID).with_columns(dup, pl.lit(True).alias(IN_E))
    a = (actual.select(spec.input_cols + spec.agg_cols)
         .with_columns(dup, pl.lit(True).alias(IN_A))
         .rename({c: c + ACT for c in other_in + spec.agg_cols}))
    j = e.join(a, on=jc + [DUP], how="full", nulls_equal=True, coalesce=True)

    lines = []
    missing = j.filter(pl.col(IN_A).is_null())
    extra = j.filter(pl.col(IN_E).is_null())
    both = j.filter(pl.col(IN_E) & pl.col(IN_A))
    ok = True
    lines.append(f"rows: expected {expected.height}, output {actual.height}, matched {both.height}")
    if missing.height:
        ok = False
        lines.append(f"{missing.height} expected rows missing from output, e.g.:")
        for r in missing.select(jc).head(show).iter_rows(named=True):
            lines.append(f"  {r}")
    if extra.height:
        ok = False
        lines.append(f"{extra.height} output rows not in expected (extra/duplicate/altered key), e.g.:")
        for r in extra.select(jc).head(show).iter_rows(named=True):
            lines.append(f"  {r}")

    bad_masks = []
    max_abs = 0.0
    max_rel = 0.0
    for c in other_in:
        m = ~both[c].eq_missing(both[c + ACT])
        bad_masks.append((c, m))
    for c in spec.agg_cols:
        ev = both[c].cast(pl.Float64)
        av = both[c + ACT].cast(pl.Float64)
        nullmis = ev.is_null() != av.is_null()
        if c.endswith("_count"):
            valmis = (ev != av).fill_null(False)
        else:
            bothnan = (ev.is_nan() & av.is_nan()).fill_null(False)
            # Polars compares NaN as equal to NaN and not below anything
            # else, so a NaN on one side only must be caught by name.
            onenan = (ev.is_nan() != av.is_nan()).fill_null(False)
            diff = (ev - av).abs()
            close = ((ev == av) | (diff <= atol + rtol * ev.abs())).fill_null(False)
            both_nn = ev.is_not_null() & av.is_not_null()
            valmis = both_nn & (onenan | ~(close | bothnan))
            d = diff.filter(both_nn & ~bothnan & (ev != av))
            if d.len():
                dmax = d.max()
                if dmax is not None and dmax == dmax:
                    max_abs = max(max_abs, dmax)
                rel = (d / ev.filter(both_nn & ~bothnan & (ev != av)).abs())
                rel = rel.filter(rel.is_finite())
                if rel.len():
                    max_rel = max(max_rel, rel.max())
        bad_masks.append((c, nullmis | valmis))

    bad_rows = None
    for c, m in bad_masks:
        n = int(m.sum())
        if n:
            ok = False
            lines.append(f"column {c!r}: {n} mismatching rows")
            bad_rows = m if bad_rows is None else (bad_rows | m)
    if bad_rows is not None:
        sub = both.filter(bad_rows).head(show)
        lines.append(f"first {sub.height} mismatching rows:")
        masks_sub = {c: m.filter(bad_rows).head(show) for c, m in bad_masks}
        for i, r in enumerate(sub.iter_rows(named=True)):
            key = {k: r[k] for k in jc}
            diffs = [f"{c}: expected {fmt(r[c])} got {fmt(r[c + ACT])}"
                     for c, _ in bad_masks if masks_sub[c][i]]
            lines.append(f"  {key}  " + "; ".join(diffs))
    stats = dict(max_abs=max_abs, max_rel=max_rel, rows=both.height)
    return ok, lines, stats


# --------------------------------------------------------------------------


def main(argv=None):
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        pl = _import_polars()
        try:
            in_files = parquet_files(args.input, "input", "*.parquet")
        except FileNotFoundError as e:
            raise UsageError(str(e))
        if not in_files:
            raise UsageError(f"no parquet files in input directory {args.input}")
        base = read_parquet(pl, in_files).with_row_index(RID)
        spec = Spec(args, base, pl)
    except UsageError as e:
        print(f"usage error: {e}", file=sys.stderr)
        return 2

    mode = f"closed={spec.closed} " + (f"period={spec.period}" if spec.period else f"window={spec.window}") + (f" by={','.join(spec.by)}" if spec.by else " ungrouped")
    print(f"check_rolling: {base.height} input rows, order={spec.order}"
          f"{' (timestamp ' + spec.unit + ')' if spec.unit else ''}, {mode}, "
          f"{len(spec.agg_cols)} agg columns, join on {spec.join_cols if len(spec.join_cols) < 6 else 'all input columns'}")

    try:
        out_files = parquet_files(args.output, "output", "part-*.parquet")
        if not out_files:
            raise OutputError(f"no parquet files in output directory {args.output}")
        actual = read_parquet(pl, out_files)
    except (OutputError, FileNotFoundError) as e:
        print(f"FAIL: {e}")
        return 1
    except Exception as e:  # unreadable / inconsistent parts
        print(f"FAIL: cannot read output {args.output}: {type(e).__name__}: {e}")
        return 1

    problems = check_schema(spec, base, actual, pl)
    if problems:
        print("FAIL: output schema:")
        for p in problems:
            print(f"  {p}")
        return 1

    all_ok = True
    checked = 0
    for eng in args.engines:
        t0 = time.time()
        try:
            exp = (expected_duckdb if eng == "duckdb" else expected_polars)(spec, base, pl)
        except ImportError as e:
            print(f"usage error: engine {eng} unavailable: {e}", file=sys.stderr)
            return 2
        except SkipEngine as e:
            print(f"[{eng}] SKIP: {e}")
            continue
        checked += 1
        t1 = time.time()
        ok, lines, st = compare(spec, exp, actual, args.rtol, args.atol, args.show, pl)
        t2 = time.time()
        status = "OK" if ok else "FAIL"
        print(f"[{eng}] {status}: {st['rows']} rows matched, max abs err {st['max_abs']:.3g}, "
              f"max rel err {st['max_rel']:.3g} (compute {t1 - t0:.2f}s, compare {t2 - t1:.2f}s)")
        if not ok:
            for ln in lines:
                print(f"  {ln}")
        all_ok &= ok
    if not checked:
        print("usage error: no engine could check this case", file=sys.stderr)
        return 2
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
