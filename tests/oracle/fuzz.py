#!/usr/bin/env python3
"""Differential fuzz of braid's `rolling` (CPU) against DuckDB and Polars.

Each case writes a random Parquet input and runs `rolling` on it with random
parameters, then `check_rolling.py` (this folder) compares the output with
DuckDB and Polars. The inputs aim at edges a fixed test misses:

  - order column: int64, int32, date32 or timestamp[s|ms|us|ns]; uniform,
    bursts with long gaps, heavy ties, all equal, negative values; windows
    from 0 to past the whole span, as integers or (timestamps, dates)
    durations such as 90s, 3d or 1h30m (Polars' forms; 10i on integers);
    calendar windows (1mo, 1q, 1y, 1mo15d) on ms, us and date columns;
    timestamps in time zones (daylight-saving changes, a skipped day) with
    days, weeks and months on the local clock (1d, 1w1d, 1mo) or hours;
  - group column: none, int64, string or float64 (0.0 and -0.0, NaNs of
    several bit patterns), few or many keys, nulls (one group);
  - values: float64 with nulls, NaN, +-inf or huge magnitudes next to tiny
    ones; int64, int32, uint8, float32 columns; all-null columns;
  - sizes: 0, 1 and 2 rows, fewer rows than ranks, up to ~200k rows;
  - job: 1-8 ranks, local or tcp, tiny chunks, a memory limit that spills,
    1-5 threads a rank (BRAID_RANK_THREADS) or the default share of cores;
  - input: the Parquet file, or (--csv-share of the cases whose columns
    CSV carries: integer, date or timestamp (s, ms, us, no zone) order,
    integer, float64 or string columns, none all null) the same rows as
    CSV text: one file, .csv.gz, or a directory of 1-4 parts (some
    header-only), dates written year first or day first (2024/3/9,
    09.03.2024), timestamps with a space or T and maybe Z or offsets,
    whose types `rolling` infers while the oracle reads the Parquet
    (rewritten with CSV's one integer type, int64, and the inferred
    timestamp: microseconds, in UTC where the text names zones).

    python3 tests/oracle/fuzz.py --rolling target/release/rolling --cases 40 \
        --seed 1 [--out /tmp/braid-fuzz] [--keep] [--mpi-rolling PATH]

With --mpi-rolling (a `rolling` built with `--features braid-examples/mpi`)
about a third of the cases run under `mpirun -np RANKS --oversubscribe`
with `--backend mpi` instead.

Prints one line per case and a summary; exit status 1 if any case fails
(the case's input, command and the oracle's report stay under --out).
Needs duckdb, polars and pyarrow.
"""

import argparse
import calendar
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
AGGS = ["sum", "mean", "min", "max", "count", "std", "var"]
CLOSED = ["right", "both", "left", "none"]
# A duration suffix and its length in seconds, for --window on timestamps.
DURATIONS = [("ms", 1e-3), ("s", 1), ("m", 60), ("h", 3600), ("d", 86400)]
UNIT_PER_SECOND = {"ms": 10**3, "us": 10**6, "ns": 10**9, "date": 1 / 86400}
# Zones of timestamp columns: daylight-saving changes in either hemisphere,
# a 30-minute one (Lord Howe), a skipped day (Apia, 2011-12-30), none.
ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Pacific/Apia",
         "America/Santiago", "Asia/Kolkata"]


def order_values(rng, rows):
    """Random order values (ints) and the span they cover."""
    kind = rng.choice(["uniform", "uniform", "bursts", "ties", "equal", "negative", "extreme"])
    if kind == "uniform":
        span = rng.choice([rows + 1, 10 * rows + 1, 10**6, 10**12])
        ts = [rng.randrange(span) for _ in range(rows)]
    elif kind == "bursts":
        ts, t = [], 0
        while len(ts) < rows:
            t += rng.choice([1, 10, 10**4, 10**7])
            for _ in range(min(rows - len(ts), rng.randrange(1, 400))):
                ts.append(t + rng.randrange(50))
        rng.shuffle(ts)
        span = t + 50
    elif kind == "ties":
        span = max(1, rows // rng.choice([2, 20, 500]))
        ts = [rng.randrange(span) for _ in range(rows)]
    elif kind == "equal":
        span = 1
        ts = [12345] * rows
    elif kind == "negative":
        span = 2 * 10**6
        ts = [rng.randrange(span) - 10**6 for _ in range(rows)]
    else:
        # Near either end of i64: t - w must not wrap.
        span = 10**6
        base = rng.choice([-2**63, 2**63 - span])
        ts = [base + rng.randrange(span) for _ in range(rows)]
    return kind, ts, max(span, 1)


def value_column(rng, rows, kind):
    """(values, arrow type name) for one value column of the given kind."""
    null = rng.choice([0.0, 0.05, 0.5, 0.95, 1.0])
    out = []
    for _ in range(rows):
        if rng.random() < null:
            out.append(None)
            continue
        if kind == "f64":
            out.append(round(rng.gauss(0, 100), 3))
        elif kind == "f64_special":
            r = rng.random()
            out.append(
                float("nan") if r < 0.03 else
                float("inf") if r < 0.05 else
                float("-inf") if r < 0.07 else
                round(rng.gauss(0, 100), 3))
        elif kind == "f64_offset":
            # A large mean with a small spread: variance by sums of squares
            # cancels here unless computed with care.
            out.append(1e9 + rng.random())
        elif kind == "i64":
            out.append(rng.randrange(-10**6, 10**6))
        elif kind == "i64_big":
            out.append(rng.randrange(-2**62, 2**62))
        elif kind == "f64_huge":
            # Sums overflow to +inf; tiny values next to huge ones. (No
            # -1e308: sums that cancel huge terms depend on the order of
            # addition, and each engine has its own.)
            out.append(rng.choice([1e308, 1e-300, 3.5, 1e300]))
        elif kind == "i32":
            out.append(rng.randrange(-2**31, 2**31))
        elif kind == "u8":
            out.append(rng.randrange(256))
        elif kind == "f32":
            out.append(float(rng.randrange(-5000, 5000)) / 8)
    return out


ARROW_TYPE = {
    "f64": "float64", "f64_special": "float64", "f64_offset": "float64",
    "i64": "int64", "i64_big": "int64", "f64_huge": "float64", "i32": "int32", "u8": "uint8", "f32": "float32",
}


def make_case(rng, i, d, local_share=0.15):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rng.choice([0, 1, 2, 3, 7, 50, 1000, 5000, 30000, 200000])
    ts_kind, ts, span = order_values(rng, rows)
    # Parquet stores s as ms; i32 and date (days) where the values fit.
    unit = rng.choice([None, None, "ms", "us", "ns", "i32", "date"])
    cols = {
        "id": pa.array(rng.sample(range(rows * 3 + 1), rows), pa.int64()),
        "ts": pa.array(ts, pa.int64()),
    }
    if unit in ("i32", "date") and not all(-2**31 <= t < 2**31 for t in ts):
        unit = None
    if unit == "i32":
        cols["ts"] = cols["ts"].cast(pa.int32())
    elif unit == "date":
        cols["ts"] = cols["ts"].cast(pa.int32()).cast(pa.date32())
    elif unit:
        cols["ts"] = cols["ts"].cast(pa.timestamp(unit))
    zone = None
    if rows and rng.random() < local_share:
        # Local times around daylight-saving changes (spring and autumn of
        # both hemispheres, a 30-minute change, a skipped day in Apia).
        zone = rng.choice(ZONES)
        unit = rng.choice(["ms", "us", "ns"])
        ts_kind = "local"
        per = UNIT_PER_SECOND[unit]
        start = calendar.timegm((rng.randrange(1995, 2035), rng.choice([3, 4, 9, 10, 11, 12]),
                                 rng.randrange(1, 29), 0, 0, 0))
        span_s = rng.choice([3, 20, 70]) * 86400
        ts = sorted(int((start + rng.randrange(span_s)) * per + rng.randrange(int(per))) for _ in range(rows))
        if rng.random() < 0.3:  # ties
            ts = [ts[j - j % 3] for j in range(rows)]
        rng.shuffle(ts)
        cols["ts"] = pa.array(ts, pa.int64()).cast(pa.timestamp(unit, tz=zone))
    key = rng.choice([None, "int", "str", "float"])
    if key:
        nkeys = rng.choice([1, 2, 7, 100, 5000])
        knull = rng.choice([0.0, 0.05, 0.5])
        ks = [None if rng.random() < knull else rng.randrange(nkeys) for _ in range(rows)]
        if key == "str":
            cols["key"] = pa.array([None if k is None else f"k{k}" for k in ks], pa.string())
        elif key == "float":
            # 0.0 and -0.0 group together, as do NaNs of any bit pattern.
            nans = [math.nan, -math.nan, struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]]
            cols["key"] = pa.array(
                [None if k is None else rng.choice([0.0, -0.0]) if k == 0
                 else rng.choice(nans) if k == 1 else k + 0.5 for k in ks], pa.float64())
        else:
            cols["key"] = pa.array([None if k is None else k - nkeys // 2 for k in ks], pa.int64())
    # Sometimes a second group column: groups are the (key, key2) pairs.
    key2 = bool(key) and rng.random() < 0.3
    if key2:
        cols["key2"] = pa.array(
            [None if rng.random() < 0.1 else rng.choice(["a", "b", "c"]) for _ in range(rows)],
            pa.string())
    # (Huge values are checked with DuckDB only, which does not check
    # local-clock windows.)
    kinds = rng.sample([k for k in ARROW_TYPE if not (zone and k == "f64_huge")], rng.choice([1, 1, 2, 3]))
    values = []
    for j, kind in enumerate(kinds):
        name = f"v{j}"
        cols[name] = pa.array(value_column(rng, rows, kind), ARROW_TYPE[kind])
        values.append(name)
    inp = os.path.join(d, "in.parquet")
    pq.write_table(pa.table(cols), inp, row_group_size=rng.choice([1000, 65536]))

    # The window: an integer in storage units, or a duration on timestamps.
    w = rng.choice([0, 1, 2, 10, span // 100, span // 3, span, 10 * span])
    w_arg = str(w)
    if unit in UNIT_PER_SECOND and rng.random() < 0.5:
        # One term (90s) or, as Polars writes them, several (1h30m, "2d 3h").
        terms = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            suffix, secs = rng.choice(DURATIONS)
            n = rng.choice([0, 1, 3, 90, 1000])
            per = UNIT_PER_SECOND[unit] * secs
            if per >= 1 and float(per).is_integer():
                terms.append((n, suffix, n * int(per)))
        if terms:
            w = sum(t[2] for t in terms)
            w_arg = rng.choice(["", " "]).join(f"{n}{sfx}" for n, sfx, _ in terms)
    elif unit in (None, "i32") and rng.random() < 0.2:
        w_arg = f"{w}i"  # Polars' index form on an integer column
    period = None
    in_range = unit in UNIT_PER_SECOND and max(map(abs, ts), default=0) / UNIT_PER_SECOND[unit] < 9e12
    # (DuckDB's timestamps end about 290000 years from 1970.)
    if unit in ("ms", "us", "date") and in_range and rng.random() < 0.3:
        # A calendar window (Polars' form; braid and DuckDB step back
        # months on the calendar). Sub-day parts only on timestamps.
        forms = ["1mo", "2mo", "1q", "1y", "1mo15d", "1y6mo", "1mo1w"]
        if unit != "date":
            forms += ["1mo12h", "1mo90s"]
        period = w_arg = rng.choice(forms)
    if zone is not None:
        # Days, weeks and months on the zone's local clock; hours absolute.
        period = w_arg = rng.choice(["1d", "2d", "1w", "1d12h", "1mo", "1w1d", "3h", "1mo1d", "36h", "1q"])
    closed = rng.choice(CLOSED)
    aggs = rng.sample(AGGS, rng.randrange(1, len(AGGS) + 1))
    ranks = rng.choice([1, 2, 3, 4, 5, 8])
    backend = "tcp" if rng.random() < 0.25 else "local"
    out = os.path.join(d, rng.choice(["out", "out.parquet"]))
    cmd = [
        "--input", inp, "--output", out, "--order", "ts", "--values", ",".join(values),
        "--window", w_arg, "--closed", closed, "--aggs", ",".join(aggs),
        "--ranks", str(ranks), "--backend", backend,
        "--chunk-rows", str(rng.choice([1, 7, 1000, 65536])),
    ]
    check = [
        "--input", inp, "--output", out, "--order", "ts", "--values", ",".join(values),
        "--closed", closed, "--aggs", ",".join(aggs),
    ] + (["--period", period] if period else ["--window", str(w)])
    if "f64_huge" in kinds:
        # Polars' rolling variance of values near f64's limit gives 0 where
        # the true (and DuckDB's) value overflows to inf.
        check += ["--engines", "duckdb"]
    if key:
        by = "key,key2" if key2 else "key"
        cmd += ["--by", by]
        check += ["--by", by]
    if rows > 1000 and rng.random() < 0.2:
        cmd += ["--memory-limit", "1MiB"]
    desc = (f"rows={rows} ts={ts_kind}/{unit or 'i64'} key={key}{'+key2' if key2 else ''} values={kinds} "
            f"{' zone=' + zone if zone else ''} w={w_arg} closed={closed} ranks={ranks}/{backend}")
    # A window of 0 holds no rows but with closed both: the command line
    # refuses it (what it must say).
    refusal = "holds no rows" if period is None and w == 0 and closed != "both" else None
    return cmd, check, desc, refusal


# Value kinds whose CSV text reads back as the same values (f32 would read
# as float64 and sum differently; huge values are DuckDB-only already).
CSV_KINDS = {"f64", "f64_special", "f64_offset", "i64", "i64_big", "i32", "u8"}


def write_csv_input(rng, d, table):
    """The table as CSV text: one file (maybe gzipped) or a directory of
    parts in row order (maybe header-only ones); returns its path."""
    import gzip
    import io

    import pyarrow.csv as pcsv

    def text(t):
        b = io.BytesIO()
        pcsv.write_csv(t, b)
        return b.getvalue()

    form = rng.choice(["file", "gz", "dir", "dir"])
    if form == "file":
        path = os.path.join(d, "in.csv")
        with open(path, "wb") as f:
            f.write(text(table))
        return path, form
    if form == "gz":
        path = os.path.join(d, "in.csv.gz")
        with gzip.open(path, "wb") as f:
            f.write(text(table))
        return path, form
    path = os.path.join(d, "in_csv")
    os.makedirs(path)
    parts = rng.choice([1, 2, 3, 4])
    cuts = sorted(rng.randrange(table.num_rows + 1) for _ in range(parts - 1))
    bounds = [0] + cuts + [table.num_rows]
    for j in range(parts):
        part = table.slice(bounds[j], bounds[j + 1] - bounds[j])
        with open(os.path.join(path, f"part{j}.csv"), "wb") as f:
            f.write(text(part))
    return path, f"dir/{parts}"


# Forms of a CSV date that DuckDB and Polars both read, the same way:
# year first, or day first (never month first).
DATE_FORMS = {
    "iso": lambda y, m, d: f"{y:04}-{m:02}-{d:02}",
    "ymd/": lambda y, m, d: f"{y:04}/{m}/{d}",
    "ymd.": lambda y, m, d: f"{y:04}.{m:02}.{d:02}",
    "dmy/": lambda y, m, d: f"{d:02}/{m:02}/{y:04}",
    "dmy-": lambda y, m, d: f"{d}-{m}-{y:04}",
    "dmy.": lambda y, m, d: f"{d:02}.{m:02}.{y:04}",
}


def order_text(rng, col):
    """The order column (date32, or a timestamp in s, ms or us without a
    zone) as CSV text in a random form (DATE_FORMS; timestamps with a
    space or T, maybe a Z or an offset, the instant kept); returns the
    text, the type `rolling` infers from it (which the oracle reads), and
    the form's name. None where a value has no such text (years outside
    1-9999)."""
    import datetime

    import pyarrow as pa

    form = rng.choice(sorted(DATE_FORMS))
    date = DATE_FORMS[form]
    epoch = datetime.datetime(1970, 1, 1)
    if col.type == pa.date32():
        out = []
        for v in col.cast(pa.int32()).to_pylist():
            if v is None:
                out.append(None)
                continue
            try:
                x = (epoch + datetime.timedelta(days=v)).date()
            except OverflowError:
                return None
            out.append(date(x.year, x.month, x.day))
        return pa.array(out, pa.string()), pa.date32(), form
    per = {"s": 1, "ms": 10**3, "us": 10**6}[col.type.unit]
    sep = rng.choice([" ", "T"])
    # Offsets keep the instant: the column is UTC (as DuckDB's TIMESTAMPTZ).
    zone = rng.choice([None, None, "Z", "+02:00", "-05:30", "mixed"])
    out = []
    for v in col.cast(pa.int64()).to_pylist():
        if v is None:
            out.append(None)
            continue
        z = zone
        if zone == "mixed":
            # (The first with a zone: the column is UTC however it goes on.)
            z = rng.choice(["Z", "+01:00", "-08:00", "+05:45", ""]) if out else "Z"
        off = 0 if z in (None, "", "Z") else (1 if z[0] == "+" else -1) * (int(z[1:3]) * 60 + int(z[4:6]))
        try:
            x = epoch + datetime.timedelta(seconds=v // per, microseconds=(v % per) * (10**6 // per))
            x += datetime.timedelta(minutes=off)
        except OverflowError:
            return None
        if not 1 <= x.year <= 9999:
            return None
        frac = ""
        if per > 1 and x.microsecond:
            frac = "." + f"{x.microsecond:06}"[: {10**3: 3, 10**6: 6}[per]]
        out.append(date(x.year, x.month, x.day) + sep + x.strftime("%H:%M:%S") + frac + (z or ""))
    return pa.array(out, pa.string()), pa.timestamp("us", tz="UTC" if zone else None), form + (f"+{zone}" if zone else "")


def csv_variant(rng, cmd, check, d, desc):
    """Switches the case's input to CSV where its columns allow (see
    CSV_KINDS); returns the new description, or None where it stays."""
    import pyarrow.parquet as pq

    inp = cmd[cmd.index("--input") + 1]
    t = pq.read_table(inp)
    if t.num_rows == 0:
        return None
    import pyarrow as pa
    for name in t.column_names:
        col = t.column(name)
        ty = col.type
        if name == "ts":
            ok = ty in (pa.int64(), pa.int32(), pa.date32()) or (
                pa.types.is_timestamp(ty) and ty.tz is None and ty.unit != "ns")
            if ty == pa.date32():
                # Dates past year 9999 (or before year 1) have no ISO text:
                # pyarrow writes "<value out of range: ...>" for them.
                import pyarrow.compute as pc
                days = pc.min_max(col.cast(pa.int32()))
                lo, hi = days["min"].as_py(), days["max"].as_py()
                ok = lo is None or (-719162 <= lo and hi <= 2932896)
        elif name.startswith("key"):
            ok = ty in (pa.int64(), pa.string())
        else:
            ok = ty in (pa.float64(), pa.int64(), pa.int32(), pa.uint8())
        if not ok or col.null_count == t.num_rows:
            return None
    if any(k not in CSV_KINDS for k in desc.split("values=")[1].split("]")[0].strip("[").replace("'", "").split(", ")):
        return None
    # CSV has one integer type: the oracle reads the same rows with the
    # types that `rolling` infers from the text.
    t = pa.table({
        name: t.column(name).cast(pa.int64()) if t.column(name).type in (pa.int32(), pa.uint8())
        else t.column(name) for name in t.column_names})
    # Dates and timestamps as text in one of the forms both engines read;
    # the oracle reads the type `rolling` infers (microseconds, in UTC
    # where the text names zones).
    text, ts_form = t, "iso"
    ty = t.column("ts").type
    if ty == pa.date32() or pa.types.is_timestamp(ty):
        got = order_text(rng, t.column("ts").combine_chunks())
        if got is None:
            return None
        ts_text, ts_type, ts_form = got
        if pa.types.is_timestamp(ty) and ty.unit != "us":
            # An integer window counts the column's unit: now microseconds.
            scale = 10**6 // {"s": 1, "ms": 10**3}[ty.unit]
            for argv in (cmd, check):
                if "--window" in argv:
                    k = argv.index("--window") + 1
                    if argv[k].lstrip("-").isdigit():
                        argv[k] = str(int(argv[k]) * scale)
        i = t.column_names.index("ts")
        t = t.set_column(i, "ts", t.column("ts").cast(ts_type))
        text = t.set_column(i, "ts", ts_text)
    pq.write_table(t, inp)
    path, form = write_csv_input(rng, d, text)
    cmd[cmd.index("--input") + 1] = path
    return desc + f" csv={form} ts_text={ts_form}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rolling", default="target/release/rolling")
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="/tmp/braid-fuzz")
    ap.add_argument("--keep", action="store_true", help="keep passing cases' files too")
    ap.add_argument("--mpi-rolling", default=None,
                    help="a `rolling` built with the mpi feature: a share of the cases "
                         "(--mpi-share) then runs under mpirun with --backend mpi")
    ap.add_argument("--mpi-share", type=float, default=0.3)
    ap.add_argument("--csv-share", type=float, default=0.25,
                    help="share of the cases (of those CSV can carry) whose input is CSV")
    ap.add_argument("--local-share", type=float, default=0.15,
                    help="share of cases on timestamps in time zones (local-clock windows)")
    a = ap.parse_args()
    failed, unchecked = [], []
    for i in range(a.cases):
        rng = random.Random(a.seed * 1_000_003 + i)
        d = os.path.join(a.out, f"case-{a.seed}-{i}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cmd, check, desc, refusal = make_case(rng, i, d, a.local_share)
        # CSV input drawn apart too, so the cases stay as seeds drew them.
        crng = random.Random(f"csv-{a.seed}-{i}")
        if crng.random() < a.csv_share:
            desc = csv_variant(crng, cmd, check, d, desc) or desc
        # Threads a rank spreads its CPU work over (BRAID_RANK_THREADS; the
        # default shares the cores), drawn apart so the cases stay as seeds
        # drew them before.
        threads = random.Random(f"threads-{a.seed}-{i}").choice([None, 1, 2, 3, 5])
        env = dict(os.environ)
        env.pop("BRAID_RANK_THREADS", None)
        # Open MPI 4 and 5 allow root through these (as through
        # --allow-run-as-root); other launchers ignore them.
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        if threads is not None:
            env["BRAID_RANK_THREADS"] = str(threads)
            desc += f" threads={threads}"
        argv = [a.rolling] + cmd
        if a.mpi_rolling and random.Random(f"mpi-{a.seed}-{i}").random() < a.mpi_share:
            # The same case as MPI ranks: mpirun starts --ranks processes.
            nranks = cmd[cmd.index("--ranks") + 1]
            cmd[cmd.index("--backend") + 1] = "mpi"
            argv = ["mpirun", "--oversubscribe", "-np", nranks,
                    a.mpi_rolling] + cmd
            desc = desc.replace("/local", "/mpi").replace("/tcp", "/mpi")
        t0 = time.time()
        run = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        verdict = "ok"
        if refusal is not None:
            report = run.stderr
            if run.returncode == 0 or refusal not in run.stderr:
                verdict = f"not refused with {refusal!r}"
            else:
                desc += " (refused)"
        elif run.returncode != 0:
            verdict = "rolling failed"
            report = run.stderr
        else:
            orc = subprocess.run(
                [sys.executable, os.path.join(HERE, "check_rolling.py")] + check,
                capture_output=True, text=True, timeout=600)
            report = orc.stdout + orc.stderr
            if orc.returncode == 2 and "no engine could check this case" in orc.stderr:
                # Both engines skipped it (DuckDB's intervals stop at
                # microseconds; Polars' rolling keeps its start from moving
                # back): not checked, which is said, and not a failure.
                verdict = "unchecked"
                unchecked.append(i)
            elif orc.returncode != 0:
                verdict = "oracle disagrees"
        print(f"case {a.seed}-{i}: {verdict} ({time.time() - t0:.1f} s) {desc}", flush=True)
        if verdict not in ("ok", "unchecked"):
            failed.append(i)
            with open(os.path.join(d, "report.txt"), "w") as f:
                f.write((f"BRAID_RANK_THREADS={threads} " if threads else "") + " ".join(argv) + "\n\ncheck_rolling.py " + " ".join(check) + "\n\n" + report)
            print("  " + "\n  ".join(report.strip().splitlines()[-12:]), flush=True)
        elif not a.keep:
            shutil.rmtree(d, ignore_errors=True)
    print(f"{a.cases - len(failed) - len(unchecked)} of {a.cases} cases agree"
          + (f"; failed: {failed}" if failed else "")
          + (f"; no engine could check {unchecked}" if unchecked else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
