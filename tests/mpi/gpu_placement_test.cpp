// SPDX-License-Identifier: Apache-2.0
// The decisions of mirror::mpi::place_gpus (backends/mpi/gpu_placement.hpp) without MPI: a
// worker's rank on its host, and which claims NCCL would refuse.
#include <catch2/catch.hpp>

#include <string>
#include <vector>
#include <mirror/backends/mpi/gpu_placement.hpp>

using mirror::mpi::gpu_claim;

TEST_CASE("gpu placement: a worker's host rank counts the workers before it on its host", "[mpi][gpu]") {
  const std::vector<std::string> hosts{"a", "b", "a", "a", "b"};
  CHECK(mirror::mpi::host_rank(hosts, 0) == 0);
  CHECK(mirror::mpi::host_rank(hosts, 1) == 0);
  CHECK(mirror::mpi::host_rank(hosts, 2) == 1);
  CHECK(mirror::mpi::host_rank(hosts, 3) == 2);
  CHECK(mirror::mpi::host_rank(hosts, 4) == 1);
}

TEST_CASE("gpu placement: two workers of one host on one GPU are refused, naming both, the host and the GPU",
          "[mpi][gpu]") {
  const std::vector<gpu_claim> claims{{"node1", "", {"0000:41:00.0"}, 1},
                                      {"node2", "", {"0000:41:00.0"}, 1},  // another host: its own GPU
                                      {"node1", "", {"0000:41:00.0"}, 1}};
  const std::string why = mirror::mpi::gpu_conflict(claims, false, 22809);
  CHECK_THAT(why, Catch::Contains("workers 0 and 2, both on host node1"));
  CHECK_THAT(why, Catch::Contains("the same GPU (PCI 0000:41:00.0)"));
  CHECK_THAT(why, Catch::Contains("NCCL_HOSTID"));
  CHECK_THAT(why, Catch::Contains("NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL 2.30"));
  CHECK_THAT(why, Catch::Contains("loaded NCCL 22809"));
  // NCCL told to allow it: nothing to refuse.
  CHECK(mirror::mpi::gpu_conflict(claims, true, 23007).empty());
}

TEST_CASE("gpu placement: distinct NCCL_HOSTIDs, distinct GPUs, or several GPUs each without overlap are accepted",
          "[mpi][gpu]") {
  CHECK(mirror::mpi::gpu_conflict(std::vector<gpu_claim>{{"n", "x", {"0000:41:00.0"}, 1},
                                                         {"n", "y", {"0000:41:00.0"}, 1}},
                                  false, 22809)
            .empty());
  CHECK(mirror::mpi::gpu_conflict(std::vector<gpu_claim>{{"n", "", {"0000:41:00.0"}, 2},
                                                         {"n", "", {"0000:42:00.0"}, 2}},
                                  false, 22809)
            .empty());
  CHECK(mirror::mpi::gpu_conflict(std::vector<gpu_claim>{{"n", "", {"0000:41:00.0", "0000:42:00.0"}, 4},
                                                         {"n", "", {"0000:43:00.0", "0000:44:00.0"}, 4}},
                                  false, 22809)
            .empty());
  // The same NCCL_HOSTID on one host is one host to NCCL: refused.
  const std::string why = mirror::mpi::gpu_conflict(
      std::vector<gpu_claim>{{"n", "x", {"0000:41:00.0", "0000:42:00.0"}, 4},
                             {"n", "x", {"0000:43:00.0", "0000:42:00.0"}, 4}},
      false, 22809);
  CHECK_THAT(why, Catch::Contains("workers 0 and 1, both on host n, NCCL_HOSTID x"));
  CHECK_THAT(why, Catch::Contains("PCI 0000:42:00.0"));
}
