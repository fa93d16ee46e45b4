#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_mpi.sh NP PROGRAM [ARGS...]: one multi-worker test launch (docs/multi-worker.md#tests).
# Exit 77 (Meson: skipped) with a visible SKIP line when mpirun is missing; every launch is
# bounded by timeout -k, so a hung rank or mpirun can never hang the suite.
np=$1
shift
# MIRROR_MPIRUN: another MPI's mpirun (build-ft: Open MPI 5's, from the wheel in build-ft).
mpirun=${MIRROR_MPIRUN:-mpirun}
if ! command -v "$mpirun" >/dev/null 2>&1; then
  echo "SKIP: mpirun not found: the multi-worker (MPI) tests did NOT run (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 77
fi
. "$(dirname "$0")/mpi_env.sh"  # root, containers, sanitizer options
as_root=
[ "$(id -u)" = 0 ] && as_root=--allow-run-as-root
# --bind-to none: with np <= 2 Open MPI pins each rank to one core, and with it all of the
# rank's replica threads. --oversubscribe: more ranks than cores (CI has 2).
exec timeout -k 10 ${MIRROR_MPI_TIMEOUT:-120} "$mpirun" $as_root --oversubscribe --bind-to none ${MIRROR_MPI_ARGS:-} -np "$np" "$@"
