#!/bin/bash
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
REPO=$(pwd); B=/tmp/g62b; mkdir -p $B; for f in gpu_job gpu_kernels rolling; do gunzip -c .dev/g62b/$f.gz > $B/$f; chmod +x $B/$f; done
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
echo "== gpu_kernels" >> $L; timeout 300 $B/gpu_kernels 2>&1 | grep -E "test result|FAILED|panicked" >> $L
echo "== gpu_job" >> $L; timeout 400 $B/gpu_job 2>&1 | grep -E "^test |test result|panicked" >> $L
echo "== gpu_fuzz" >> $L; timeout 400 python3 bench/gpu_fuzz.py --rolling $B/rolling --cases 24 --ranks 1 2 --seed 6202 --out /tmp/fz 2>&1 | tail -3 >> $L
echo "== skewed keys: GPU job vs CPU job, row by row, and the GPU ranks' rows" >> $L
cd /tmp
for ranks in 1 2 3; do for keys in 1 3; do for closed in right both; do
  a="--rows 300000 --keys $keys --by key --window 5000 --closed $closed --ranks $ranks --aggs sum,mean,min,max,count,std,var"
  timeout 120 $B/rolling $a --device cpu --output /tmp/c.csv > /tmp/c.log 2>&1
  timeout 120 $B/rolling $a --device gpu --output /tmp/g.csv > /tmp/g.log 2>&1
  r=$(python3 -c "import sys; sys.path.insert(0,'$REPO/bench'); import gpu_fuzz; print(gpu_fuzz.compare('/tmp/c.csv','/tmp/g.csv') or 'same')" 2>&1)
  echo "ranks $ranks keys $keys $closed: $r | gpu: $(grep -E 'rows out' /tmp/g.log | tr '\n' ' ')" >> $L
done; done; done
echo "== GPU job, 20M rows, --by key --keys 1 vs 100, 1 and 2 ranks (one GPU)" >> $L
for ranks in 1 2; do for keys in 100 1; do
  echo "ranks $ranks keys $keys: $(timeout 200 $B/rolling --device gpu --rows 20000000 --ranks $ranks --by key --keys $keys 2>&1 | grep -E 'rows out' | tr '\n' ' ')" >> $L
done; done
date >> $L
cat $L
