#!/usr/bin/env bash
# Install OpenMPI (if missing) and build the MPI collective baseline benchmark.
#
# Usage: bench/install_mpi.sh [OUT]
#   OUT defaults to <repo>/target/bench/mpi_coll. The binary path is printed
#   on the last line of output.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
OUT="${1:-$REPO_ROOT/target/bench/mpi_coll}"

if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    echo "installing OpenMPI via apt-get..." >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        openmpi-bin libopenmpi-dev >&2
fi

mkdir -p "$(dirname "$OUT")"
mpicc -O2 -Wall -o "$OUT" "$SCRIPT_DIR/mpi_coll.c"
# Absolute path of the binary, on the last line.
echo "$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
