#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_mpi.sh NP PROGRAM [ARGS...]: one multi-worker test launch (multi_worker.md section 7).
# Exit 77 (Meson: skipped) with a visible SKIP line when mpirun is missing; every launch is
# bounded by timeout -k, so a hung rank or mpirun can never hang the suite.
np=$1
shift
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found: the multi-worker (MPI) tests did NOT run (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 77
fi
# Open MPI refuses root unless told twice; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# In containers the shared-memory transport's CMA copy fails (open-mpi/ompi#4948).
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# Sanitizer builds: MPI_Init's allocations are never freed (Open MPI's own "leaks"), which is not
# mirror's to fix; leak checking stays on in every other suite.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# ThreadSanitizer builds: Open MPI's uninstrumented locking is reported as races and
# lock-order inversions inside MPI itself; suppress those (only Open MPI's modules).
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS }suppressions=$(cd "$(dirname "$0")" && pwd)/tsan_openmpi.supp"
as_root=
[ "$(id -u)" = 0 ] && as_root=--allow-run-as-root
# --bind-to none: with np <= 2 Open MPI pins each rank to one core, and with it all of the
# rank's replica threads. --oversubscribe: more ranks than cores (CI has 2).
exec timeout -k 10 ${MIRROR_MPI_TIMEOUT:-120} mpirun $as_root --oversubscribe --bind-to none ${MIRROR_MPI_ARGS:-} -np "$np" "$@"
