// SPDX-License-Identifier: Apache-2.0
// devices::Cluster<devices::Cuda> under mpirun without a GPU: libmirror_cuda's and
// libmirror_nccl's host code against the scripted CUDA runtime and NCCL of
// tests/support/fake_nccl.cpp (each process its own fake "GPUs"; bus ids "0000:10:00.0" for
// GPU 0, "0000:11:00.0" for GPU 1, the same in every process, as one host's GPUs are).
// What runs is the GPU placement the workers agree on before any CUDA runtime or NCCL call
// (mpi::place_gpus): which GPU each worker takes, and the refusal, on every worker, of two
// workers of one host on one GPU. Every worker runs on this one host.
#include <catch2/catch.hpp>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <mirror/mirror.hpp>
#include "support/fake_nccl.hpp"

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Cuda>;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

Cluster cluster(std::vector<int> gpus) {
  return Cluster{.local = {.gpus = std::move(gpus), .timeout = std::chrono::seconds(30)},
                 .timeout = std::chrono::seconds(30)};
}

}  // namespace

TEST_CASE("cluster<cuda> (fake GPUs): with .gpus empty each worker takes the GPU at its rank on the host",
          "[mpi][cuda][fake]") {
  fake_nccl::reset({.devices = size(), .ranks_elsewhere = size() - 1});
  mirror::Strategy<Cluster> s{cluster({})};
  CHECK(s.num_replicas_in_sync() == size());
  CHECK(s.runtime().device_of(0) == rank());
}

TEST_CASE("cluster<cuda> (fake GPUs): more workers than the host's GPUs is refused on every worker, naming two "
          "workers on one GPU, before NCCL",
          "[mpi][cuda][fake]") {
  if (size() < 2) return;
  fake_nccl::reset({.devices = 1});
  for (const bool listed : {false, true}) {
    CAPTURE(listed);
    try {
      mirror::Strategy<Cluster> s{cluster(listed ? std::vector<int>{0} : std::vector<int>{})};
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("workers 0 and 1, both on host"));
      CHECK_THAT(what, Catch::Contains("the same GPU (PCI 0000:10:00.0)"));
    }
  }
  CHECK(fake_nccl::snapshot().groups_launched == 0);
}

TEST_CASE("cluster<cuda> (fake GPUs): a distinct NCCL_HOSTID per process lets the workers share one GPU",
          "[mpi][cuda][fake]") {
  fake_nccl::reset({.devices = 1, .ranks_elsewhere = size() - 1});
  const std::string id = "mirror-test-host-" + std::to_string(rank());
  ::setenv("NCCL_HOSTID", id.c_str(), 1);
  try {
    // Placement accepts it; NCCL's bootstrap comes next (each process's fake NCCL has its own
    // ranks only, so the strategy is built and dropped, nothing reduced).
    mirror::Strategy<Cluster> s{cluster({})};
    CHECK(s.runtime().device_of(0) == 0);
  } catch (...) {
    ::unsetenv("NCCL_HOSTID");
    throw;
  }
  ::unsetenv("NCCL_HOSTID");
}
