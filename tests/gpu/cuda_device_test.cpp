// SPDX-License-Identifier: Apache-2.0
// devices::Cuda on a real GPU: device leaves reduced in place, errors, NCCL's refusal.
#include <catch2/catch.hpp>
#include <atomic>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::ReduceOp;

TEST_CASE("cuda: device_span leaves are reduced in place on logical devices sharing one GPU", "[cuda][device]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 4}};
  REQUIRE(s.num_replicas_in_sync() == 4);
  constexpr std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<mirror::cuda::device_buffer<float>> buffers;
  for (int r = 0; r < 4; ++r) {
    buffers.emplace_back(s.runtime().device_of(r), n);
    buffers.back().upload(std::vector<float>(n, float(r + 1)));
  }
  s.run([&](auto& ctx) {
    ctx.all_reduce(ReduceOp::sum, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
  });
  for (auto& b : buffers) {
    std::vector<float> host(n);
    b.download(host);
    REQUIRE(host == std::vector<float>(n, 10.0f));
  }
}

TEST_CASE("cuda: a replica that skips a collective is named in a timeout_error", "[cuda][device]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{
      {.gpus = {0}, .replicas_per_gpu = 2, .timeout = std::chrono::seconds(2)}};
  try {
    s.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) return;
      ctx.all_reduce(ReduceOp::sum, 1.0f);
    });
    FAIL("no timeout_error");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{1});
  }
  const auto ok = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 2); });
  REQUIRE(ok.primary() == 4);
}

TEST_CASE("cuda: a GPU that does not exist is an invalid_argument naming it", "[cuda][device]") {
  REQUIRE_THROWS_WITH((mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice>{{.gpus = {4096}}}),
                      Catch::Contains("GPU 4096 does not exist"));
}

#if MIRROR_HAS_NCCL
TEST_CASE("cuda: NcclAllReduce refuses several replicas on one GPU and names the policies that work",
          "[cuda][nccl_all_reduce]") {
  using S = mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce>;
  REQUIRE_THROWS_WITH((S{{.gpus = {0}, .replicas_per_gpu = 2}}),
                      Catch::Contains("ReductionToOneDevice") && Catch::Contains("HierarchicalCopy"));
}

TEST_CASE("cuda: NcclAllReduce on every GPU reduces device leaves in place", "[cuda][nccl_all_reduce]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce> s{};
  const int R = s.num_replicas_in_sync();
  constexpr std::size_t n = 4099;
  std::vector<mirror::cuda::device_buffer<double>> buffers;
  for (int r = 0; r < R; ++r) {
    buffers.emplace_back(s.runtime().device_of(r), n);
    buffers.back().upload(std::vector<double>(n, double(r)));
  }
  for (const auto op : {ReduceOp::sum, ReduceOp::max}) {
    for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)].upload(std::vector<double>(n, double(r)));
    s.run([&](auto& ctx) {
      ctx.all_reduce(op, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
    });
    const double want = op == ReduceOp::sum ? double(R * (R - 1) / 2) : double(R - 1);
    for (auto& b : buffers) {
      std::vector<double> host(n);
      b.download(host);
      REQUIRE(host == std::vector<double>(n, want));
    }
  }
}
#endif
