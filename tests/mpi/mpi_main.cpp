// SPDX-License-Identifier: Apache-2.0
// The multi-worker tests' setup around the common Catch2 main (tests/support/catch_main.cpp):
// every rank runs every test case (they are collective), rank 0 reports on stdout, the other
// ranks on stderr, and the job fails when any rank failed. MPI is initialised with
// MPI_THREAD_MULTIPLE here, as a program that also calls MPI itself must (mirror's
// communication thread runs beside it).
//
// Compiled a second time with MIRROR_TEST_RANKS_DIE=1 for the fault-tolerant tests
// (elastic_test.cpp), where some ranks die on purpose: there the job's verdict is each
// survivor's own exit status (mpirun --with-ft ulfm exits 0 when the dead were killed and every
// survivor returned 0), not an all-reduce over MPI_COMM_WORLD, which has dead members.
#include <string>
#include <vector>
#if MIRROR_TEST_RANKS_DIE
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#endif
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

extern "C" int mirror_test_main(int argc, char** argv, int (*run_session)(int, const char* const*)) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<std::string> args(argv, argv + argc);
  if (rank != 0) {
    args.push_back("--out");
    args.push_back("/dev/stderr");
  }
  std::vector<const char*> cargs;
  for (const auto& a : args) cargs.push_back(a.c_str());
  int failed = run_session(static_cast<int>(cargs.size()), cargs.data());
#if MIRROR_TEST_RANKS_DIE
  // Open MPI 5.0's MPI_Finalize can wait for ever on the survivors of a death (its launcher's
  // final barrier still counts a dead process; plain MPI programs show it too, about one run in
  // 30 after two deaths). The verdict is known by now: give Finalize 15 s, then leave with it.
  std::thread([failed] {
    std::this_thread::sleep_for(std::chrono::seconds(15));
    std::fprintf(stderr, "mpi_main: MPI_Finalize did not return within 15 s; exiting with the tests' verdict\n");
    std::_Exit(failed == 0 ? 0 : 1);
  }).detach();
#else
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  failed = worst;
#endif
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
