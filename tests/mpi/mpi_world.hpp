// SPDX-License-Identifier: Apache-2.0
#pragma once
// MPI_COMM_WORLD's size and this process's rank, for the multi-worker tests (which compare with
// plain MPI calls; MPI is initialised by tests/mpi/mpi_main.cpp).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
