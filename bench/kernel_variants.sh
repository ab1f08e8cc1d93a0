#!/bin/bash
# Times variants of kernels.cu side by side on the device machine, with one
# binary: each variant is a whole source file that BRAID_KERNEL_SOURCE
# points the binary at (NVRTC compiles it on first use, cached per variant).
#
#   here:   cargo build --release -p braid-examples --features cuda --bin braid-bench
#           cargo test --release -p braid-tests --features cuda --test gpu_kernels --no-run
#           mkdir -p .dev/k && cp kernels/src/gpu/kernels.cu .dev/k/v0.cu   (edit copies: v1.cu ...)
#           tar cJf .dev/bin.txz -C <folder holding braid-bench and gpu_kernels> braid-bench gpu_kernels
#   device: VARIANTS="v0 v1" NCU="v1" bench/kernel_variants.sh      (carry .dev)
#
# For each variant: the rolling tests of gpu_kernels against the CPU, then
# `braid-bench gpu-rolling` twice, alternated; with NCU, an ncu profile of
# `rolling_tile` (20M rows) split at barriers by bench/ncu_segments.py.
# Results in $OUT/log.txt (and the ncu source pages, gzipped).
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B && tar xJf .dev/bin.txz -C $B
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
V="${VARIANTS:-v0}"
WINDOW="${WINDOW:-64}"
t0=$(date +%s)
for v in $V; do
  echo "== tests $v" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 300 $B/gpu_kernels rolling 2>&1 | grep -E "test result|FAILED|panicked" | head -5 >> $L
done
echo "tests done $(( $(date +%s) - t0 )) s" >> $L
for round in 1 2; do for v in $V; do
  echo "== bench $v round $round" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu $B/braid-bench gpu-rolling --window $WINDOW --reps 9 2>&1 | grep -E "^\| (D2D|rolling)" >> $L
done; done
echo "bench done $(( $(date +%s) - t0 )) s" >> $L
for v in ${NCU:-}; do
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 240 ncu --clock-control none -k regex:'^rolling_tile$' --launch-count 1 --section SourceCounters --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy -o /tmp/ncu-$v $B/braid-bench gpu-rolling --window $WINDOW --n 20000000 --reps 1 > /tmp/ncu-$v.txt 2>&1
  tail -3 /tmp/ncu-$v.txt >> $L
  ncu --import /tmp/ncu-$v.ncu-rep --page details > $OUT/ncu-$v-details.txt 2>&1
  ncu --import /tmp/ncu-$v.ncu-rep --page source --csv --print-source sass > /tmp/src-$v.csv 2>&1
  gzip -c /tmp/src-$v.csv > $OUT/src-$v.csv.gz
  echo "== segments $v" >> $L
  python3 bench/ncu_segments.py /tmp/src-$v.csv >> $L 2>&1
done
echo "all done $(( $(date +%s) - t0 )) s" >> $L
cat $L
