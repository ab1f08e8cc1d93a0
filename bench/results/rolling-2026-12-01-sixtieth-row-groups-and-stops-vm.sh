#!/bin/bash
# Old (fc83669 + 401a769 pieces, built 06:10) vs new release binaries: Parquet inputs of many row groups, and stop latency.
OLD=/tmp/braid-bin60; NEW=/work/main/target/release
cd /tmp/bm
python3 -c "
import pyarrow as pa, pyarrow.parquet as pq
for n, g in [(2000,1),(8000,1),(200000,100),(1000000,1000)]:
    pq.write_table(pa.table({'ts':pa.array(range(n),pa.int64()),'v':[1.0]*n}),f'rg-{n}-{g}.parquet',row_group_size=g)
"
echo "## Parquet inputs of many row groups: rolling --input F --window 5 (no output), seconds, wall"
for f in rg-2000-1 rg-8000-1 rg-200000-100 rg-1000000-1000; do
  for ranks in 1 4; do
    for b in OLD NEW; do
      bin=${!b}
      /usr/bin/time -o /tmp/bm/t -f "%e" timeout 300 $bin/rolling --input $f.parquet --window 5 --ranks $ranks > /dev/null 2>&1; t=$(cat /tmp/bm/t)
      echo "$f ranks=$ranks $b $t"
    done
  done
done
echo "## Stop latency: rolling --rows 40000000 --ranks 2, SIGINT at D s, seconds from the signal to the exit"
for d in 1 2 3; do
  for b in OLD NEW; do
    bin=${!b}
    $bin/rolling --rows 40000000 --ranks 2 > /dev/null 2>&1 & P=$!
    sleep $d; t0=$(date +%s.%N); kill -INT $P; wait $P; rc=$?; t1=$(date +%s.%N)
    echo "D=$d $b rc=$rc $(echo "$t1 - $t0" | bc)"
  done
done
