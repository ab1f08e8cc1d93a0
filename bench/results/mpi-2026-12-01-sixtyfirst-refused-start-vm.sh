#!/bin/bash
# mpirun -np 2 of a job every rank refuses at start (BRAID_MPI_TAG_UB below
# the standard's 32767), N times, counting mpirun's exit statuses: 124 or 137 =
# still running after 20 s (hung), 139 = mpirun itself crashed (SIGSEGV).
# usage: WORKER=path/to/braid-test-worker (mpi feature) N
W=$1; N=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BRAID_BACKEND=mpi BRAID_MPI_TAG_UB=32766
export TMPDIR=$(mktemp -d)
declare -A rc
for i in $(seq 1 $N); do
  timeout -k 5 20 mpirun --oversubscribe -np 2 $W coll 1 >/dev/null 2>&1
  r=$?; rc[$r]=$(( ${rc[$r]:-0} + 1 ))
done
for k in "${!rc[@]}"; do echo "exit $k: ${rc[$k]} of $N"; done
rm -rf "$TMPDIR"
