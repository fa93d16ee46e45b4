#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_mpi_gpu.sh PROGRAM [ARGS...]: a devices::Cluster<Cuda> test launch, one process per GPU
# (nvidia-smi -L counts them; MIRROR_MPI_GPUS overrides). Without a GPU (or nvidia-smi) one
# process is started, and the program itself prints a SKIP line and exits 77 before MPI starts.
np=${MIRROR_MPI_GPUS:-}
if [ -z "$np" ]; then
  np=0
  command -v nvidia-smi >/dev/null 2>&1 && np=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "$np" -ge 1 ] 2>/dev/null || np=1
fi
exec sh "$(cd "$(dirname "$0")" && pwd)/run_mpi.sh" "$np" "$@"
