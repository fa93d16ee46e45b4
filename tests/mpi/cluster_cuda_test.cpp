// SPDX-License-Identifier: Apache-2.0
// devices::Cluster<devices::Cuda> under mpirun, one process per GPU (run_mpi_gpu.sh): NCCL
// communicators spanning every GPU of every worker, bootstrapped over MPI, plus the host-side
// cross-worker paths (Strategy::reduce of host values, variables' initial broadcast). Without a
// GPU every process prints a SKIP line and exits 77 before MPI starts (skip_without_gpu.cpp).
// Values are integer-valued floats, so every sum is exact and compared bit for bit.
#include <catch2/catch.hpp>
#include <mirror/mirror.hpp>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#if MIRROR_HAS_NCCL && MIRROR_HAS_MPI
namespace {

using mirror::ReduceOp;
using Cluster = mirror::devices::Cluster<mirror::devices::Cuda>;
static_assert(std::is_same_v<mirror::default_ops_t<Cluster>, mirror::ops::NcclAllReduce>);

// This process's GPU: its rank on the host (Open MPI, MPICH, Slurm) modulo the GPUs it sees, so
// workers on one host never share a GPU (NCCL refuses that).
int my_gpu() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v) % mirror::cuda::device_count();
  }
  return 0;
}

Cluster cluster() {
  return Cluster{.local = {.gpus = {my_gpu()}, .timeout = std::chrono::seconds(60)},
                 .timeout = std::chrono::seconds(60)};
}

// Element i of global replica g: small integers, so every sum is exact in float.
float value(int g, std::size_t i) { return float((g + 1) * static_cast<int>(i % 7 + 1)); }

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

TEST_CASE("cluster<cuda>: one NCCL communicator per GPU spans every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int W = s.num_workers();
  REQUIRE(s.num_local_replicas() == 1);
  REQUIRE(s.num_replicas_in_sync() == W);
  const int N = s.num_replicas_in_sync();
  const int first = s.worker_index() * s.num_local_replicas();

  constexpr std::size_t n = (std::size_t{1} << 16) + 5;
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
    std::vector<mirror::cuda::device_buffer<float>> buffers;
    std::vector<mirror::cuda::device_buffer<float>> seconds;  // a second leaf: NcclAllReduce packs them
    for (int r = 0; r < s.num_local_replicas(); ++r) {
      std::vector<float> host(n), other(n / 3);
      for (std::size_t i = 0; i < n; ++i) host[i] = value(first + r, i);
      for (std::size_t i = 0; i < other.size(); ++i) other[i] = value(first + r, i + 3);
      buffers.emplace_back(s.runtime().device_of(r), n);
      buffers.back().upload(host);
      seconds.emplace_back(s.runtime().device_of(r), other.size());
      seconds.back().upload(other);
    }
    s.run([&](auto& ctx) {
      const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group() - first);
      ctx.all_reduce(op, std::tuple{buffers[r].span(), seconds[r].span()});
    });
    // The serial reference: global replicas in order.
    std::vector<float> want(n), want2(n / 3);
    for (int g = 0; g < N; ++g) {
      for (std::size_t i = 0; i < n; ++i) want[i] += value(g, i);
      for (std::size_t i = 0; i < want2.size(); ++i) want2[i] += value(g, i + 3);
    }
    for (int r = 0; r < s.num_local_replicas(); ++r) {
      std::vector<float> got(n), got2(n / 3);
      buffers[static_cast<std::size_t>(r)].download(got);
      seconds[static_cast<std::size_t>(r)].download(got2);
      if (op == ReduceOp::sum) {
        REQUIRE(got == want);
        REQUIRE(got2 == want2);
      } else {
        // ncclAvg pre-multiplies by 1/N: exact (bit for bit) when N is a power of two.
        for (std::size_t i = 0; i < n; ++i) {
          const float m = want[i] / float(N);
          if (power_of_two(N)) {
            REQUIRE(got[i] == m);
          } else {
            REQUIRE(got[i] == Approx(m).epsilon(1e-6));
          }
        }
      }
    }
  }

  // Integer mean: sum, then divided as C++ divides, by W*G (not by the local count).
  const auto means = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::mean, 2 * ctx.replica_id_in_sync_group() + 1); });
  REQUIRE(means.primary() == (N * N) / N);  // sum of the first N odd numbers is N*N
  const auto sums = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, ctx.replica_id_in_sync_group() + 1); });
  REQUIRE(sums.primary() == N * (N + 1) / 2);
}

TEST_CASE("cluster<cuda>: Strategy::reduce of host values spans every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int N = s.num_replicas_in_sync();
  const auto per_replica = s.run([](auto& ctx) {
    return std::vector<float>{float(ctx.replica_id_in_sync_group() + 1), 2.0f};
  });
  const std::vector<float> total = s.reduce(ReduceOp::sum, per_replica);
  REQUIRE(total == std::vector<float>{float(N * (N + 1) / 2), float(2 * N)});
  const std::vector<float> mean = s.reduce(ReduceOp::mean, per_replica);
  REQUIRE(mean == std::vector<float>{float(N * (N + 1) / 2) / float(N), 2.0f});
}

TEST_CASE("cluster<cuda>: variables start as the chief's initial value on every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  // Every worker passes its own init (an unseeded initialiser); the chief's wins.
  auto v = s.make_variable(std::vector<float>{float(s.worker_index()), 7.0f}, mirror::VariableAggregation::sum);
  for (const auto& copy : mirror::Strategy<Cluster>::local_results(v)) REQUIRE(copy == std::vector<float>{0.0f, 7.0f});
  const auto b = s.broadcast(std::vector<int>{s.worker_index() + 10});
  REQUIRE(b.primary() == std::vector<int>{10});
}
#endif
