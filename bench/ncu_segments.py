"""Splits an ncu source page of one kernel into segments at barriers and
prints each segment's share of executed instructions and of stall samples,
with its top opcodes (bench/kernel_variants.sh runs it on the device):

    ncu --import R.ncu-rep --page source --csv --print-source sass > src.csv
    python3 bench/ncu_segments.py src.csv
"""
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1])))
# find header row
hi = next(i for i, r in enumerate(rows) if any('Source' == c.strip() for c in r))
h = [c.strip() for c in rows[hi]]
def col(*names):
    for n in names:
        for i, c in enumerate(h):
            if c == n: return i
    for n in names:
        for i, c in enumerate(h):
            if n.lower() in c.lower(): return i
    return None
ci = col('Instructions Executed'); cs = col('Warp Stall Sampling (All Samples)', 'Warp Stall Sampling'); csrc = col('Source')
print('columns:', h[ci], '|', h[cs] if cs is not None else None)
def num(x):
    try: return float(x.replace(',', ''))
    except: return 0.0
segs = []; cur = collections.Counter(); ci_sum = 0; cs_sum = 0; n = 0
tot_i = tot_s = 0
data = rows[hi + 1:]
for r in data:
    if len(r) <= max(ci, csrc): continue
    src = r[csrc].strip(); ins = num(r[ci]); st = num(r[cs]) if cs is not None else 0
    tot_i += ins; tot_s += st
for r in data:
    if len(r) <= max(ci, csrc): continue
    src = r[csrc].strip(); ins = num(r[ci]); st = num(r[cs]) if cs is not None else 0
    op = src.split()[0] if src else '?'
    if op.startswith('@'): op = src.split()[1] if len(src.split()) > 1 else op
    op = op.split('.')[0]
    cur[op] += ins; ci_sum += ins; cs_sum += st; n += 1
    if op in ('BAR', 'EXIT'):
        segs.append((n, ci_sum, cs_sum, cur, src)); cur = collections.Counter(); ci_sum = cs_sum = n = 0
segs.append((n, ci_sum, cs_sum, cur, 'end'))
print(f'total inst {tot_i:.0f} samples {tot_s:.0f}')
for k, (n, a, b, c, src) in enumerate(segs):
    if a < 0.002 * tot_i and b < 0.002 * tot_s: continue
    top = ', '.join(f'{o} {100*v/tot_i:.1f}' for o, v in c.most_common(8))
    print(f'{k:2d} n={n:4d} inst={100*a/tot_i:5.1f}% samp={100*b/max(tot_s,1):5.1f}% end={src[:40]}')
    print(f'     ops: {top}')
