// SPDX-License-Identifier: Apache-2.0
// The multi-worker tests' setup around the common Catch2 main (tests/support/catch_main.cpp):
// every rank runs every test case (they are collective), rank 0 reports on stdout, the other
// ranks on stderr, and the job fails when any rank failed. MPI is initialised with
// MPI_THREAD_MULTIPLE here, as a program that also calls MPI itself must (mirror's
// communication thread runs beside it).
#include <string>
#include <vector>
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
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
