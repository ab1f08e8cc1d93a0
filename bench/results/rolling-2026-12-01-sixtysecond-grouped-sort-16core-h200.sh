#!/bin/bash
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
B=/tmp/g62; mkdir -p $B; for f in gpu_job rolling rolling_old; do gunzip -c .dev/g62/$f.gz > $B/$f; chmod +x $B/$f; done
L=$OUT/log.txt
{ date; nvidia-smi -L; nproc; } > $L 2>&1
echo "== gpu_job" >> $L; timeout 300 $B/gpu_job 2>&1 | grep -E "^test |test result|panicked" >> $L
echo "== gpu_fuzz (GPU job vs the CPU job, whose grouped path is new)" >> $L; timeout 300 python3 bench/gpu_fuzz.py --rolling $B/rolling --cases 20 --ranks 1 --seed 6201 --out /tmp/fz 2>&1 | tail -22 >> $L
echo "== CPU job, 16 cores, 20M rows, 8 ranks: old (b6530d9) vs new, alternated" >> $L
cd /tmp
for round in 1 2; do
  for args in "--by key" "--by key --keys 8" "--by key --keys 1" ""; do
    for b in rolling_old rolling; do
      r=$($B/$b --rows 20000000 --ranks 8 $args 2>&1 | grep -E "^rolling:|rows out" | tr '\n' ' ')
      echo "round $round | $b | $args | $r" >> $L
    done
  done
done
date >> $L
cat $L
