// SPDX-License-Identifier: Apache-2.0
// backends/cuda/cuda_runtime.cpp without a GPU: Strategy<devices::Cuda> on two "GPUs" of the
// scripted CUDA runtime in tests/support/fake_nccl.cpp (host memory; streams that run at once),
// which refuses a kernel launched on another device's stream or touching memory its device
// cannot reach. The cases are issue 28's: the caller's current device and current_stream()
// after run, a device_buffer for another GPU made inside fn, a peer-access failure, and a
// thrown CUDA error left behind as the thread's last error.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <vector>
#include <mirror/mirror.hpp>
#include "support/fake_nccl.hpp"
#include "support/serial_fold.hpp"

using mirror::ReduceOp;
using Strategy = mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice>;

namespace {

// Two replicas on GPUs 0 and 1 all-reduce a host vector (staged to their devices and back).
std::vector<float> sums(Strategy& s) {
  const auto out = s.run([](auto& ctx) {
    std::vector<float> mine(5, float(ctx.replica_id_in_sync_group() + 1));
    return ctx.all_reduce(ReduceOp::sum, mine);
  });
  return out.primary();
}

void require_rules_kept() {
  const auto r = fake_nccl::snapshot();
  for (const auto& v : r.violations) FAIL_CHECK(v);
  REQUIRE(r.violations.empty());
}

}  // namespace

TEST_CASE("cuda runtime: the caller's device and a null current_stream() after construction and run",
          "[cuda][fake]") {
  fake_nccl::reset({.devices = 4});
  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  {
    Strategy s{{.gpus = {0, 1}}};
    REQUIRE(fake_nccl::current_device() == 3);
    REQUIRE(sums(s) == std::vector<float>(5, 3.0f));
    REQUIRE(fake_nccl::current_device() == 3);  // the calling thread ran replica 0 on GPU 0
    REQUIRE(mirror::cuda::current_stream() == nullptr);
  }
  REQUIRE(fake_nccl::current_device() == 3);  // destruction too
  require_rules_kept();
}

TEST_CASE("cuda runtime: after a device_buffer for another GPU is made inside fn, combine still launches on the "
          "replica's device", "[cuda][fake]") {
  fake_nccl::reset({.devices = 2});
  Strategy s{{.gpus = {0, 1}}};
  // Two arrays on each replica's GPU, combined by the runtime's primitive (what every policy's
  // kernels go through) right after the buffer helpers worked on the other GPU.
  std::vector<mirror::cuda::device_buffer<float>> a, b;
  for (int g = 0; g < 2; ++g) {
    a.emplace_back(g, 3);
    b.emplace_back(g, 3);
    a.back().upload(std::vector<float>(3, 1.0f));
    b.back().upload(std::vector<float>(3, 2.0f));
  }
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    mirror::cuda::device_buffer<float> other(1 - r, 3);
    other.upload(std::vector<float>(3, 7.0f));
    const auto u = static_cast<std::size_t>(r);
    s.runtime().combine(r, ReduceOp::sum, mirror::cuda::device_ptr<float>{a[u].data(), r},
                        mirror::cuda::device_ptr<float>{b[u].data(), r}, 3);
    s.runtime().divide(r, mirror::cuda::device_ptr<float>{a[u].data(), r}, 3, 2);
  });
  for (auto& x : a) {
    std::vector<float> host(3);
    x.download(host);
    REQUIRE(host == std::vector<float>(3, 1.5f));
  }
  // And a whole collective after it.
  const auto out = s.run([](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    mirror::cuda::device_buffer<float> other(1 - r, 3);
    return ctx.all_reduce(ReduceOp::max, std::vector<float>{float(r), 4.0f});
  });
  REQUIRE(out.primary() == std::vector<float>{1.0f, 4.0f});
  require_rules_kept();
}

TEST_CASE("cuda runtime: a failed cudaDeviceEnablePeerAccess falls back to copies through the replica's device",
          "[cuda][fake]") {
  for (const int error : {0, static_cast<int>(cudaErrorTooManyPeers)}) {
    fake_nccl::reset({.devices = 2, .enable_peer_error = error});
    Strategy s{{.gpus = {0, 1}}};  // used to throw backend_error for cudaErrorTooManyPeers
    REQUIRE(fake_nccl::last_error() == cudaSuccess);
    // A device leaf on each GPU: replica 0 combines replica 1's into its own, which needs peer
    // access or a copy to GPU 0 first (the fake refuses a kernel that touches the other GPU's
    // memory without it).
    std::vector<mirror::cuda::device_buffer<double>> leaves;
    for (int g = 0; g < 2; ++g) {
      leaves.emplace_back(g, 4);
      leaves.back().upload(std::vector<double>(4, g + 0.5));
    }
    const int copies_before = fake_nccl::snapshot().peer_copies;
    s.run([&](auto& ctx) {
      ctx.all_reduce(ReduceOp::sum, leaves[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
    });
    for (auto& l : leaves) {
      std::vector<double> host(4);
      l.download(host);
      REQUIRE(host == std::vector<double>(4, 2.0));
    }
    if (error != 0) REQUIRE(fake_nccl::snapshot().peer_copies > copies_before);  // the staged path ran
    require_rules_kept();
  }
}

TEST_CASE("cuda runtime: a CUDA failure thrown as backend_error is not left as the thread's last error",
          "[cuda][fake]") {
  fake_nccl::reset({.devices = 2});
  Strategy s{{.gpus = {0, 1}}};
  REQUIRE_THROWS_AS((mirror::cuda::device_buffer<float>(0, std::size_t{1} << 40)), mirror::backend_error);
  REQUIRE(fake_nccl::last_error() == cudaSuccess);
  // The same inside fn: the failure is the replica's error; the next run's launches are clean.
  REQUIRE_THROWS_AS(s.run([](auto& ctx) {
                      if (ctx.replica_id_in_sync_group() == 0) mirror::cuda::device_buffer<float>(0, std::size_t{1} << 40);
                      (void)ctx.all_reduce(ReduceOp::sum, 1.0f);
                    }),
                    mirror::backend_error);
  REQUIRE(sums(s) == std::vector<float>(5, 3.0f));
  require_rules_kept();
}

TEST_CASE("cuda runtime: ReductionToOneDevice folds each slice in one kernel where every replica's memory is "
          "reachable, with the bits of copy and combine", "[cuda][fake][fold]") {
  // Floats of mixed magnitudes: a sum in any other order, or rounded differently, gives other bits.
  constexpr int n = 40;  // over 16-float lines: every replica owns a slice
  auto reference = [&](ReduceOp op, int replicas) {
    std::vector<float> out(n);
    for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = mirror::test::serial_fold(op, replicas, static_cast<std::size_t>(i));
    return out;
  };
  auto check_every_op = [&](Strategy& s) {
    const int replicas = s.num_replicas_in_sync();
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      INFO("op " << static_cast<int>(op) << ", " << replicas << " replicas");
      const auto out = s.run([&](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        std::vector<float> mine(n);
        for (int i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = mirror::test::mixed_magnitude(r, static_cast<std::size_t>(i));
        return ctx.all_reduce(op, mine);
      });
      for (const auto& v : out) REQUIRE(v == reference(op, replicas));
    }
  };
  SECTION("three logical replicas on one GPU: fused") {
    fake_nccl::reset({.devices = 1});
    Strategy s{{.gpus = {0}, .replicas_per_gpu = 3}};
    check_every_op(s);
    CHECK(fake_nccl::snapshot().folds >= 5 * 3);  // every replica's slice, every op
  }
  SECTION("two GPUs with peer access: fused") {
    fake_nccl::reset({.devices = 2});
    Strategy s{{.gpus = {0, 1}}};
    check_every_op(s);
    CHECK(fake_nccl::snapshot().folds >= 5 * 2);
  }
  SECTION("two GPUs without peer access: copy and combine through the replica's own GPU") {
    fake_nccl::reset({.devices = 2, .can_access_peer = false});
    Strategy s{{.gpus = {0, 1}}};
    check_every_op(s);
    CHECK(fake_nccl::snapshot().folds == 0);
  }
  require_rules_kept();
}
