// SPDX-License-Identifier: Apache-2.0
// A program that calls MPI itself, as README tells such programs to: it includes <mpi.h>,
// initialises MPI with MPI_THREAD_MULTIPLE, and hands mirror its own communicator. Built outside
// the tree with nothing but `pkg-config --cflags --libs mirror` (run_consumer.sh), the CMake
// package (run_cmake.sh: mirror::mirror) and dependency('mirror') (run_subproject.sh), so it
// links only when those flags keep Open MPI's mpi.h from pulling in its C++ bindings
// (OMPI_SKIP_MPICXX / MPICH_SKIP_MPICXX: mirror links MPI's C library only). It runs as a
// singleton MPI process (W = 1). In builds without MPI it checks nothing and passes.
#include <mirror/config.hpp>

#if MIRROR_HAS_MPI
#include <mpi.h>  // before mirror's headers, as a program that uses MPI would
#endif

#include <mirror/mirror.hpp>

#include <cstdio>

int main(int argc, char** argv) {
#if MIRROR_HAS_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      ++failures;
      std::printf("FAIL: %s\n", what);
    }
  };
  check(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE provided");
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
    mirror::Strategy<Cluster> s{Cluster{.local = {.replicas = 2}, .comm = comm}};
    check(s.num_workers() == 1 && s.num_replicas_in_sync() == 2, "one worker, two replicas");
    const auto sums = s.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, ctx.replica_id_in_sync_group() + 1); });
    int ours = sums.primary(), total = 0;  // the program's own MPI call, beside mirror's
    MPI_Allreduce(&ours, &total, 1, MPI_INT, MPI_SUM, comm);
    check(total == 3, "mirror's all_reduce, then the program's MPI_Allreduce");
    // the strategy ends here, before the communicator it uses and before MPI_Finalize
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
  if (failures == 0) std::printf("contract_mpi_header: all checks held\n");
  return failures == 0 ? 0 : 1;
#else
  (void)argc;
  (void)argv;
  std::printf("contract_mpi_header: this mirror was built without MPI; nothing to check\n");
  return 0;
#endif
}
