#!/usr/bin/env python3
"""Differential fuzz of `rolling --device gpu` against `rolling --device cpu`.

Each case writes a random CSV input (int64 ts, also near either end of
i64, or times read as timestamps, or dates read as Date32, written ISO,
year first with slashes, day first with dots, or ISO with a Z (UTC), with
duration and calendar (`1mo`, `1mo15d`, `2q`) windows; with ties and
gaps, unsorted; an int, string or float key with nulls (0.0 and -0.0,
NaN), sometimes with a second group column; a float value column with
nulls and, in some cases, NaN, infinities, huge magnitudes or a large mean
with a small spread; an int value column with nulls), runs both devices with
the same random parameters (ranks, backend, window, closed mode, grouping,
aggregations, chunk size), and compares the outputs row by row (keyed by
`id`): text must be equal, or both numbers within a relative 1e-9 (sums and
variances are computed in different orders). Needs only the Python
standard library.

    python3 bench/gpu_fuzz.py --rolling target/release/rolling --cases 50 --out /tmp/fz
    python3 bench/gpu_fuzz.py --rolling target/release/rolling --ranks 2   # 2 GPUs: NCCL only

Prints one line per case and a summary; exit status 1 if any case differs
or fails on one device only.
"""

import argparse
import csv
import datetime
import math
import os
import random
import subprocess
import sys


# How a case writes its dates: ISO, year first with slashes, day first
# (DuckDB's and Polars' reading: 03/11/2020 is the 3rd of November), or ISO
# with a Z (the column then is a timestamp in UTC).
TIME_FORMS = ["iso", "iso", "ymd/", "dmy.", "isoZ"]


def iso(ms, form="iso", date_only=False):
    """Milliseconds after 2020-01-01 as a date or date-time in `form`
    (CSV readers infer a date or timestamp), on the real calendar: month
    ends (29th-31st) included, where a calendar window's month back is
    clamped."""
    t = datetime.datetime(2020, 1, 1) + datetime.timedelta(milliseconds=ms)
    day = {"ymd/": "%Y/%m/%d", "dmy.": "%d.%m.%Y"}.get(form, "%Y-%m-%d")
    if date_only:
        return t.strftime(day)
    return (t.strftime(day + ("T" if form.startswith("iso") else " ") + "%H:%M:%S.")
            + f"{t.microsecond // 1000:03d}" + ("Z" if form == "isoZ" else ""))


def gen_input(rng, path, rows, ts_mode="int", form="iso"):
    iso_ts = ts_mode != "int"
    kind = rng.choice(["plain", "plain", "nan", "huge", "ties", "offset"])
    # Order values near either end of i64 (t - window must not wrap).
    ts_base = rng.choice([0, 0, 0, -2**63, 2**63 - 1 - 10**10]) if not iso_ts else 0
    key_kind = rng.choice(["int", "int", "str", "float"])
    nkeys = rng.choice([1, 3, 50, 1000])
    span = rng.choice([rows // 10 + 1, rows * 3 + 1, 10**9 if not iso_ts else 10**10])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "ts", "key", "v", "w", "k2"])
        for i in range(rows):
            ts = ts_base + (rng.randrange(span) if kind != "ties" else rng.randrange(max(1, rows // 50)))
            if rng.random() < 0.05:
                key = ""
            elif key_kind == "str":
                key = f"k{rng.randrange(nkeys)}"
            elif key_kind == "float":
                # 0.0 and -0.0 are one group, as are NaNs.
                k = rng.randrange(nkeys)
                key = rng.choice(["0.0", "-0.0"]) if k == 0 else "NaN" if k == 1 else repr(k + 0.5)
            else:
                key = str(rng.randrange(nkeys) - nkeys // 2)
            r = rng.random()
            if r < 0.08:
                v = ""
            elif kind == "nan" and r < 0.11:
                v = rng.choice(["NaN", "inf", "-inf"])
            elif kind == "offset":
                # A large mean with a small spread (variance cancels).
                v = repr(1e9 + rng.random())
            elif kind == "huge" and r < 0.2:
                v = repr(rng.uniform(-1, 1) * 10 ** rng.randrange(100, 200))
            else:
                v = repr(rng.gauss(1e3 if rng.random() < 0.5 else 0, 50))
            wv = "" if rng.random() < 0.1 else str(rng.randrange(-1000, 1000))
            t_text = iso(ts, form, ts_mode == "date") if iso_ts else ts
            # A second group column (`--by key,k2`), nulls included.
            k2 = rng.choice(["a", "b", ""])
            w.writerow([i, t_text, key, v, wv, k2])


def run(rolling, args, out, log):
    cmd = [rolling] + args + ["--output", out]
    with open(log, "w") as lf:
        p = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, timeout=300)
    return p.returncode


def read(path):
    with open(path, newline="") as f:
        r = csv.reader(f)
        head = next(r)
        return head, {row[0]: row for row in r}


def same(a, b):
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) and math.isnan(y):
        return True
    if math.isinf(x) or math.isinf(y):
        return x == y
    return abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-300)


def compare(a, b):
    ha, ra = read(a)
    hb, rb = read(b)
    if ha != hb:
        return f"headers differ: {ha} vs {hb}"
    if ra.keys() != rb.keys():
        return f"row ids differ: {len(ra)} vs {len(rb)} rows"
    bad = 0
    first = None
    for k, row in ra.items():
        other = rb[k]
        for c, (x, y) in enumerate(zip(row, other)):
            if not same(x, y):
                bad += 1
                if first is None:
                    first = f"id {k}, column {ha[c]}: cpu {x!r}, gpu {y!r}"
    return None if bad == 0 else f"{bad} values differ; first: {first}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rolling", required=True)
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="/tmp/gpu-fuzz")
    ap.add_argument("--only", type=int, nargs="*", help="run only these cases (inputs are still drawn in order)")
    ap.add_argument("--against", default="gpu", help="the second device (cpu checks the harness)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8],
                    help="rank counts to draw from (e.g. --ranks 2 on two GPUs: one rank per GPU, NCCL)")
    a = ap.parse_args()
    if any(r < 1 for r in a.ranks):
        ap.error(f"--ranks: rank counts must be at least 1, got {a.ranks}")
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    failed = ran = 0
    for case in range(a.cases):
        rows = rng.choice([0, 1, 7, 300, 5000, 40000, 150000])
        inp = os.path.join(a.out, f"in{case}.csv")
        r = rng.random()
        ts_mode = "int" if rows == 0 or r >= 0.4 else "iso" if r < 0.3 else "date"
        # (Drawn apart: the seeds' other draws stay as they were.)
        form = random.Random(f"form-{a.seed}-{case}").choice(TIME_FORMS)
        gen_input(rng, inp, rows, ts_mode, form)
        ranks = rng.choice(a.ranks)
        backend = rng.choice(["local", "tcp"])
        aggs = rng.sample(["sum", "mean", "min", "max", "count", "std", "var"], rng.randrange(1, 8))
        args = [
            "--input", inp, "--ranks", str(ranks), "--backend", backend,
            "--window", rng.choice(["1ms", "250ms", "5s", "90s", "1h", "2d", "1mo", "1mo15d"]) if ts_mode == "iso"
            else rng.choice(["1d", "3d", "36h", "30d", "0", "2", "1mo", "2q"]) if ts_mode == "date"
            else str(rng.choice([0, 1, 10, 1000, 10**6, 10**12])),
            "--closed", rng.choice(["right", "both", "left", "none"]),
            "--values", rng.choice(["v", "w", "v,w"]),
            "--aggs", ",".join(aggs),
            "--chunk-rows", str(rng.choice([1000, 65536, 1 << 20])),
        ]
        if args[args.index("--window") + 1] == "0":
            # A zero window holds rows only with both ends closed (the
            # command line refuses it otherwise).
            args[args.index("--closed") + 1] = "both"
        if rng.random() < 0.6:
            args += ["--by", "key,k2" if rng.random() < 0.3 else "key"]
        if a.only and case not in a.only:
            continue
        ran += 1
        outs, rcs = {}, {}
        for dev, name in [("cpu", "cpu"), (a.against, "gpu")]:
            outs[name] = os.path.join(a.out, f"out{case}-{name}.csv")
            rcs[name] = run(a.rolling, args + ["--device", dev], outs[name],
                            os.path.join(a.out, f"log{case}-{name}.txt"))
        what = " ".join(args[2:]) + (f" dates={form}" if ts_mode != "int" else "")
        if rcs["cpu"] != 0 or rcs["gpu"] != 0:
            ok = rcs["cpu"] != 0 and rcs["gpu"] != 0
            verdict = "both failed" if ok else f"FAIL: exit cpu {rcs['cpu']}, gpu {rcs['gpu']}"
        else:
            diff = compare(outs["cpu"], outs["gpu"])
            ok = diff is None
            verdict = "same" if ok else f"DIFFER: {diff}"
        failed += 0 if ok else 1
        print(f"case {case}: {rows} rows, {what}: {verdict}", flush=True)
    print(f"{ran - failed} of {ran} cases agree")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
