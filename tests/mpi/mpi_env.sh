# SPDX-License-Identifier: Apache-2.0
# Sourced by run_mpi.sh and two_hosts.sh: the environment of every mpirun launch of the tests.
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
