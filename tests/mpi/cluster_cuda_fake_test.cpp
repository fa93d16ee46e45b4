// SPDX-License-Identifier: Apache-2.0
// devices::Cluster<devices::Cuda> under mpirun without a GPU: libmirror_cuda's and
// libmirror_nccl's host code against the scripted CUDA runtime and NCCL of
// tests/support/fake_nccl.cpp (each process its own fake "GPUs"; bus ids "0000:10:00.0" for
// GPU 0, "0000:11:00.0" for GPU 1, the same in every process, as one host's GPUs are).
// What runs is the GPU placement the workers agree on before any CUDA runtime or NCCL call
// (mpi::place_gpus): which GPU each worker takes, and the refusal, on every worker, of two
// workers of one host on one GPU; and an NCCL failure on one worker aborting every worker's
// communicators. Every worker runs on this one host. Each process's fake NCCL sees only its own
// ranks: the others are `ranks_elsewhere` (they count as joined, and never launch a collective
// here, so a collective across workers never completes).
#include <catch2/catch.hpp>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>
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

TEST_CASE("cluster<cuda> (fake GPUs): an NCCL failure on one worker aborts every worker's communicators within "
          "moments, and the others' errors name it",
          "[mpi][cuda][fake]") {
  if (size() < 2) return;
  const int failing = size() - 1;
  fake_nccl::reset({.fail_all_reduce_call = rank() == failing ? 1 : 0, .devices = size(),
                    .ranks_elsewhere = size() - 1});
  std::string what;
  std::chrono::steady_clock::duration took{};
  {
    // NCCL's own watchdog would give up after the local timeout (5 s + 2 x 5 s + 10 s here).
    mirror::Strategy<Cluster> s{Cluster{.local = {.timeout = std::chrono::seconds(5)}, .timeout = std::chrono::seconds(5)}};
    mirror::cuda::device_buffer<float> leaf(s.runtime().device_of(0), 16);
    leaf.upload(std::vector<float>(16, 1.0f));
    const auto start = std::chrono::steady_clock::now();
    try {
      s.run([&](auto& ctx) { ctx.all_reduce(mirror::ReduceOp::sum, leaf.span()); });
      FAIL("no error");
    } catch (const std::exception& e) {
      what = e.what();
    }
    took = std::chrono::steady_clock::now() - start;
  }
  CAPTURE(what);
  CHECK(took < std::chrono::seconds(3));
  CHECK(fake_nccl::snapshot().aborts == 1);  // this worker's one communicator, on every worker
  if (rank() == failing) {
    CHECK_THAT(what, Catch::Contains("ncclAllReduce failed"));
  } else {
    CHECK_THAT(what, Catch::Contains("worker " + std::to_string(failing) + " aborted its communicators: ncclAllReduce failed"));
  }
}
