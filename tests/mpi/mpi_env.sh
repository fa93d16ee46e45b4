# SPDX-License-Identifier: Apache-2.0
# Sourced by run_mpi.sh and two_hosts.sh: the environment of every mpirun launch of the tests.
# Open MPI refuses root unless told twice; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's single-copy transport between ranks of one host (CMA, process_vm_readv) is what users
# get by default, and makes large messages much faster (docs/multi-worker.md#the-transport); in
# containers without the ptrace permission it needs, Open MPI aborts the job at the first large
# message instead of falling back (open-mpi/ompi#4948). So it stays on where a probe of that one
# system call works, and is turned off elsewhere. A value set by the caller wins.
if [ -z "${OMPI_MCA_btl_vader_single_copy_mechanism:-}" ]; then
  mirror_cma_probe="$(dirname "$0")/cma_probe.py"
  [ -f "$mirror_cma_probe" ] || mirror_cma_probe=tests/mpi/cma_probe.py  # sourced from the repository root
  if ! python3 "$mirror_cma_probe" 2>/dev/null; then
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
  fi
fi
# Sanitizer builds: MPI_Init's allocations are never freed (Open MPI's own "leaks"), which is not
# mirror's to fix; leak checking stays on in every other suite.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# ThreadSanitizer builds: Open MPI's uninstrumented locking is reported as races and
# lock-order inversions inside MPI itself; suppress those (only Open MPI's modules).
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS }suppressions=$(cd "$(dirname "$0")" && pwd)/tsan_openmpi.supp"
