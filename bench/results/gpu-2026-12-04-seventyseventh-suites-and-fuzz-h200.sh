#!/bin/bash
# Session 77: GPU suites with this tree (CSV dates year or day first, UTC columns), then rolling --device gpu against --device cpu on fresh seeds.
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B && tar xJf .dev/bin.txz -C $B
export BRAID_TEST_WORKER=$B/braid-test-worker
L=$OUT/log.txt
{ date; nvidia-smi -L; echo "cores $(nproc)"; } > $L 2>&1
t0=$(date +%s)
if [ "${1:-all}" != fuzz ]; then
for t in gpu_kernels gpu gpu_job; do
  timeout 170 $B/$t --test-threads 1 > $OUT/$t.txt 2>&1
  rc=$?
  grep -E "^test |test result|FAILED|panicked" $OUT/$t.txt | head -40 >> $L
  echo "## $t rc=$rc $(( $(date +%s) - t0 )) s" >> $L
done
fi
if [ "${1:-all}" != suites ]; then
timeout 300 python3 bench/gpu_fuzz.py --rolling $B/rolling --seed 7711 --cases 60 --ranks 1 2 3 4 --out /tmp/gf1 > $OUT/fuzz1.txt 2>&1
echo "## fuzz 7711 rc=$? $(( $(date +%s) - t0 )) s" >> $L
tail -3 $OUT/fuzz1.txt >> $L
timeout 200 python3 bench/gpu_fuzz.py --rolling $B/rolling --seed 7712 --cases 40 --ranks 1 5 8 --out /tmp/gf2 > $OUT/fuzz2.txt 2>&1
echo "## fuzz 7712 rc=$? $(( $(date +%s) - t0 )) s" >> $L
tail -3 $OUT/fuzz2.txt >> $L
fi
