#!/bin/bash
# Session 65: deferred direct sums (w1) against the tree's kernel (w0), and the no-check ceiling (wn).
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B && tar xJf .dev/bin.txz -C $B
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
for t in gpu_kernels gpu_job; do
  echo "== $t (w1)" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-w1 BRAID_KERNEL_SOURCE=.dev/k/w1.cu timeout 300 $B/$t > $OUT/$t.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/$t.txt | head -20 >> $L
  echo "$t done $(( $(date +%s) - t0 )) s" >> $L
done
bench() { v=$1; shift; echo "== $v $*" >> $L; BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 120 $B/braid-bench gpu-rolling --reps 9 "$@" 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L; }
for round in 1 2 3; do for v in w0 w1 wn; do bench $v --window 64; done; done
echo "w64 done $(( $(date +%s) - t0 )) s" >> $L
for round in 1 2; do for v in w0 w1; do bench $v --window 16; bench $v --window 300; done; done
for v in w0 w1; do bench $v --window 64 --keys 100; done
echo "bench done $(( $(date +%s) - t0 )) s" >> $L
#!/bin/bash
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B && tar xJf .dev/bin.txz -C $B
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
echo "== gpu_kernels rolling (w2)" >> $L
BRAID_KERNEL_CACHE=/tmp/kc-w2 BRAID_KERNEL_SOURCE=.dev/k/w2.cu timeout 300 $B/gpu_kernels rolling > $OUT/gk-w2.txt 2>&1
grep -E "test result|FAILED|panicked" $OUT/gk-w2.txt | head -20 >> $L
bench() { v=$1; shift; echo "== $v $*" >> $L; BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 120 $B/braid-bench gpu-rolling --reps 9 "$@" 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L; }
for round in 1 2 3; do for v in w0 w1 w2; do bench $v --window 16; bench $v --window 64; done; done
for v in w0 w1 w2; do bench $v --window 64 --aggs sum,mean,min,max,count; done
echo "bench done $(( $(date +%s) - t0 )) s" >> $L
#!/bin/bash
# Session 65, final tree (its kernel built in): suites, GPU job against the CPU job, bench against the old kernel (w0.cu).
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B && tar xJf .dev/bin.txz -C $B
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
for t in gpu_kernels gpu_job; do
  echo "== $t" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc timeout 300 $B/$t > $OUT/$t.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/$t.txt | head -20 >> $L
  echo "$t done $(( $(date +%s) - t0 )) s" >> $L
done
echo "== gpu_fuzz" >> $L
BRAID_KERNEL_CACHE=/tmp/kc timeout 200 python3 bench/gpu_fuzz.py --rolling $B/rolling --cases 24 --ranks 1 --seed 6501 --out /tmp/fz > $OUT/fuzz.txt 2>&1
tail -3 $OUT/fuzz.txt >> $L
echo "fuzz done $(( $(date +%s) - t0 )) s" >> $L
bench() { v=$1; shift; echo "== $v $*" >> $L; if [ $v = new ]; then BRAID_KERNEL_CACHE=/tmp/kc timeout 120 $B/braid-bench gpu-rolling --reps 9 "$@"; else BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 120 $B/braid-bench gpu-rolling --reps 9 "$@"; fi 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L; }
for round in 1 2 3; do for v in w0 new; do bench $v --window 64; done; done
for v in w0 new; do bench $v --ts-unit 1000000 --window 64000000; done
echo "bench done $(( $(date +%s) - t0 )) s" >> $L
