# scripts run on the device (carry .dev: the binaries and kernel variants)

### .dev/k/run.sh
#!/bin/bash
# Kernel variants on the device: rolling tests of gpu_kernels, then gpu-rolling alternated.
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B && tar xJf .dev/bin.txz -C $B
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
V="${VARIANTS:-v0}"
t0=$(date +%s)
for v in ${TESTV:-$V}; do
  echo "== tests $v" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 300 $B/gpu_kernels ${TESTF:-rolling} > /tmp/t-$v.txt 2>&1
  grep -E "test result|FAILED|panicked|error" /tmp/t-$v.txt | head -12 >> $L
done
echo "tests done $(( $(date +%s) - t0 )) s" >> $L
for W in ${WINDOWS:-64 16}; do for round in 1 2; do for v in $V; do
  echo "== bench $v w=$W round $round ${AGGS:-}" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 120 $B/braid-bench gpu-rolling --window $W --reps 9 ${AGGS:-} 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L
done; done; done
echo "bench done $(( $(date +%s) - t0 )) s" >> $L

### .dev/k/run2.sh
#!/bin/bash
# Old binary (bin0) vs new (bin): gpu_kernels (new, all), then gpu-rolling alternated.
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/b0 /tmp/b1 && tar xJf .dev/bin0.txz -C /tmp/b0 && tar xJf .dev/bin.txz -C /tmp/b1
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
if [ -z "${NOTEST:-}" ]; then
  echo "== gpu_kernels (new)" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc1 timeout 400 /tmp/b1/gpu_kernels ${TESTF:-} > $OUT/tests.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/tests.txt | head -20 >> $L
  echo "tests done $(( $(date +%s) - t0 )) s" >> $L
fi
for W in ${WINDOWS:-64 16}; do for round in 1 2; do for b in 0 1; do
  echo "== bench b$b w=$W round $round ${AGGS:-}" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc$b timeout 120 /tmp/b$b/braid-bench gpu-rolling --window $W --reps 9 ${AGGS:-} 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L
done; done; done
echo "bench done $(( $(date +%s) - t0 )) s" >> $L

### .dev/k/run3.sh
#!/bin/bash
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/b1 && tar xJf .dev/bin.txz -C /tmp/b1
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
for v in ${TESTV:-}; do
  echo "== tests $v" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 300 /tmp/b1/gpu_kernels rolling > /tmp/t-$v.txt 2>&1
  grep -E "test result|FAILED|panicked" /tmp/t-$v.txt | head -12 >> $L
done
for W in ${WINDOWS:-64 16}; do for round in 1 2; do for v in $VARIANTS; do
  echo "== bench $v w=$W round $round" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc-$v BRAID_KERNEL_SOURCE=.dev/k/$v.cu timeout 120 /tmp/b1/braid-bench gpu-rolling --window $W --reps 9 ${AGGS:-} 2>&1 | grep -E "^\| rolling|rror" >> $L
done; done; done
echo "done $(( $(date +%s) - t0 )) s" >> $L

### .dev/k/run4.sh
#!/bin/bash
# Final checks of the plain-scan tile pass: suites, fuzz against the CPU job, bench old vs new.
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/b0 /tmp/b1 && tar xJf .dev/bin0.txz -C /tmp/b0 && tar xJf .dev/bin.txz -C /tmp/b1
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
for t in gpu_kernels gpu_job; do
  echo "== $t" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc1 timeout 300 /tmp/b1/$t > $OUT/$t.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/$t.txt | head -20 >> $L
  echo "$t done $(( $(date +%s) - t0 )) s" >> $L
done
echo "== gpu_fuzz" >> $L
BRAID_KERNEL_CACHE=/tmp/kc1 timeout 240 python3 bench/gpu_fuzz.py --rolling /tmp/b1/rolling --cases 24 --ranks 1 --seed 6301 --out /tmp/fz > $OUT/fuzz.txt 2>&1
tail -4 $OUT/fuzz.txt >> $L
echo "fuzz done $(( $(date +%s) - t0 )) s" >> $L
bench() { BRAID_KERNEL_CACHE=/tmp/kc$1 timeout 120 /tmp/b$1/braid-bench gpu-rolling --reps 9 "${@:2}" 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L; }
for round in 1 2 3; do for b in 0 1; do echo "== b$b w=64 round $round" >> $L; bench $b --window 64; done; done
for b in 0 1; do echo "== b$b w=64 aggs sum,mean,min,max,count" >> $L; bench $b --window 64 --aggs sum,mean,min,max,count; done
for b in 0 1; do echo "== b$b w=64 keys 100" >> $L; bench $b --window 64 --keys 100; done
for b in 0 1; do echo "== b$b w=64 closed both nulls? (w=1000)" >> $L; bench $b --window 1000; done
echo "== v4n (flag only) w=16" >> $L; BRAID_KERNEL_CACHE=/tmp/kc-v4n BRAID_KERNEL_SOURCE=.dev/k/v4n.cu timeout 120 /tmp/b1/braid-bench gpu-rolling --window 16 --reps 9 2>&1 | grep -E "^\| rolling" >> $L
echo "all done $(( $(date +%s) - t0 )) s" >> $L

### .dev/k/run5.sh
#!/bin/bash
# Final checks of the plain-scan tile pass: suites, fuzz against the CPU job, bench old vs new.
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/b0 /tmp/b1 && tar xJf .dev/bin0.txz -C /tmp/b0 && tar xJf .dev/bin.txz -C /tmp/b1
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
for t in gpu_kernels gpu_job; do
  echo "== $t" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc1 timeout 300 /tmp/b1/$t > $OUT/$t.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/$t.txt | head -20 >> $L
  echo "$t done $(( $(date +%s) - t0 )) s" >> $L
done
echo "== gpu_fuzz" >> $L
BRAID_KERNEL_CACHE=/tmp/kc1 timeout 240 python3 bench/gpu_fuzz.py --rolling /tmp/b1/rolling --cases 16 --ranks 1 --seed 6302 --out /tmp/fz > $OUT/fuzz.txt 2>&1
tail -4 $OUT/fuzz.txt >> $L
echo "fuzz done $(( $(date +%s) - t0 )) s" >> $L
bench() { BRAID_KERNEL_CACHE=/tmp/kc$1 timeout 120 /tmp/b$1/braid-bench gpu-rolling --reps 9 "${@:2}" 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L; }
for round in 1 2; do for b in 0 1; do echo "== b$b w=64 round $round" >> $L; bench $b --window 64; done; done
for b in 0 1; do echo "== b$b w=64 aggs sum,mean,min,max,count" >> $L; bench $b --window 64 --aggs sum,mean,min,max,count; done
for b in 0 1; do echo "== b$b w=64 keys 100" >> $L; bench $b --window 64 --keys 100; done
for b in 0 1; do echo "== b$b w=64 closed both nulls? (w=1000)" >> $L; bench $b --window 1000; done
for b in 0 1; do echo "== b$b w=16" >> $L; bench $b --window 16; done
for b in 0 1; do echo "== b$b w=700" >> $L; bench $b --window 700; done
echo "all done $(( $(date +%s) - t0 )) s" >> $L

### .dev/k/run6.sh
#!/bin/bash
# Final checks of the plain-scan tile pass: suites, fuzz against the CPU job, bench old vs new.
set -u
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/b0 /tmp/b1 && tar xJf .dev/bin0.txz -C /tmp/b0 && tar xJf .dev/bin.txz -C /tmp/b1
L=$OUT/log.txt
{ date; nvidia-smi -L; } > $L 2>&1
t0=$(date +%s)
for t in gpu_kernels gpu_job; do
  echo "== $t" >> $L
  BRAID_KERNEL_CACHE=/tmp/kc1 timeout 300 /tmp/b1/$t > $OUT/$t.txt 2>&1
  grep -E "test result|FAILED|panicked" $OUT/$t.txt | head -20 >> $L
  echo "$t done $(( $(date +%s) - t0 )) s" >> $L
done
echo "== gpu_fuzz" >> $L
BRAID_KERNEL_CACHE=/tmp/kc1 timeout 240 python3 bench/gpu_fuzz.py --rolling /tmp/b1/rolling --cases 8 --ranks 1 --seed 6303 --out /tmp/fz > $OUT/fuzz.txt 2>&1
tail -4 $OUT/fuzz.txt >> $L
echo "fuzz done $(( $(date +%s) - t0 )) s" >> $L
bench() { BRAID_KERNEL_CACHE=/tmp/kc$1 timeout 120 /tmp/b$1/braid-bench gpu-rolling --reps 9 "${@:2}" 2>&1 | grep -E "^\| (D2D|rolling)|rror" >> $L; }
for round in 1 2; do for b in 0 1; do echo "== b$b w=64 round $round" >> $L; bench $b --window 64; done; done
for b in 0 1; do echo "== b$b w=64 keys 100" >> $L; bench $b --window 64 --keys 100; done
for b in 0 1; do echo "== b$b w=64 aggs sum,mean,min,max,count" >> $L; bench $b --window 64 --aggs sum,mean,min,max,count; done
for b in 0 1; do echo "== b$b w=16" >> $L; bench $b --window 16; done
for b in 0 1; do echo "== b$b w=700" >> $L; bench $b --window 700; done
echo "all done $(( $(date +%s) - t0 )) s" >> $L
