// SPDX-License-Identifier: Apache-2.0
// The CUDA backend where no GPU is needed: errors without a device, the CPU fallback, element
// types, device leaves' traits, NCCL's settings check and packing rule. Runs in CPU-only CI.
#include <catch2/catch.hpp>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/fake_device_vector.hpp"

using mirror::ReduceOp;

TEST_CASE("cuda: without a GPU, devices::Cuda is a backend_error that names the fallback", "[cuda][no_gpu]") {
  if (mirror::cuda::device_count() > 0) {
    SUCCEED("a GPU is present: the GPU suite (tests/gpu) covers construction");
    return;
  }
  try {
    mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{};
    FAIL("no backend_error");
  } catch (const mirror::backend_error& e) {
    REQUIRE(e.code() != 0);
    REQUIRE_THAT(e.what(), Catch::Contains("no usable CUDA device") && Catch::Contains("devices::Threads") &&
                               Catch::Contains("with_available_device"));
  }
}

TEST_CASE("cuda: with_available_device runs fn on the threads backend when there is no GPU", "[cuda][no_gpu]") {
  const bool gpu = mirror::cuda::device_count() > 0;
  int ran_on_threads = 0, ran_on_cuda = 0;
  const int total = mirror::cuda::with_available_device(
      [&](auto& strategy) {
        using S = std::remove_cvref_t<decltype(strategy)>;
        if constexpr (std::is_same_v<typename S::device_type, mirror::devices::Threads>) {
          ++ran_on_threads;
        } else {
          ++ran_on_cuda;
        }
        const auto sums = strategy.run([](auto& ctx) {
          return ctx.all_reduce(ReduceOp::sum, std::vector<int>{ctx.replica_id_in_sync_group(), 1});
        });
        return sums.primary()[1];
      },
      mirror::devices::Cuda{}, mirror::devices::Threads{.replicas = 3});
  if (gpu) {
    REQUIRE(ran_on_cuda == 1);
  } else {
    REQUIRE(ran_on_threads == 1);
    REQUIRE(ran_on_cuda == 0);
    REQUIRE(total == 3);
  }
}

TEST_CASE("cuda: --device flags parse, and an explicit cuda choice without a GPU fails loudly", "[cuda][no_gpu]") {
  using mirror::cuda::device_choice;
  REQUIRE(mirror::cuda::parse_device_choice("auto") == device_choice::automatic);
  REQUIRE(mirror::cuda::parse_device_choice("cuda") == device_choice::cuda);
  REQUIRE(mirror::cuda::parse_device_choice("threads") == device_choice::threads);
  REQUIRE_THROWS_AS(mirror::cuda::parse_device_choice("gpu"), std::invalid_argument);
  const int r = mirror::cuda::with_device(device_choice::threads, [](auto& s) { return s.num_replicas_in_sync(); },
                                          {}, {.replicas = 2});
  REQUIRE(r == 2);
  if (mirror::cuda::device_count() == 0) {
    REQUIRE_THROWS_AS(mirror::cuda::with_device(device_choice::cuda, [](auto& s) { return s.num_replicas_in_sync(); }),
                      mirror::backend_error);
  }
}

TEST_CASE("cuda: element types with kernels, and device leaves", "[cuda][no_gpu]") {
  using C = mirror::detail::element_kind::category;
  using mirror::cuda::kernel_kind_of;
  using kind = mirror::detail::element_kind;
  STATIC_REQUIRE(kernel_kind_of<float>() == kind{C::floating, 4});
  STATIC_REQUIRE(kernel_kind_of<double>() == kind{C::floating, 8});
  STATIC_REQUIRE(kernel_kind_of<std::int32_t>() == kind{C::signed_integer, 4});
  STATIC_REQUIRE(kernel_kind_of<std::int64_t>() == kind{C::signed_integer, 8});
  STATIC_REQUIRE(kernel_kind_of<long long>() == kernel_kind_of<std::int64_t>());
  STATIC_REQUIRE(kernel_kind_of<std::uint8_t>() == kind{C::unsigned_integer, 1});
  // The two 16-bit floating-point types share a size and must still be told apart (NCCL's
  // datatype, the kernels, the cross-worker agreement).
  STATIC_REQUIRE(kernel_kind_of<mirror::cuda::half>() == kind{C::floating, 2});
  STATIC_REQUIRE(kernel_kind_of<mirror::cuda::bfloat16>() == kind{C::bfloat, 2});
  STATIC_REQUIRE(mirror::cuda::kind_code<mirror::cuda::half> != mirror::cuda::kind_code<mirror::cuda::bfloat16>);
  STATIC_REQUIRE(kind::from_code(kernel_kind_of<mirror::cuda::bfloat16>().code()) == kind{C::bfloat, 2});
  STATIC_REQUIRE_FALSE(mirror::cuda::has_kernels<short>);
  STATIC_REQUIRE_FALSE(mirror::cuda::has_kernels<bool>);
  STATIC_REQUIRE(mirror::leaf<mirror::cuda::device_span<float>>);
  STATIC_REQUIRE(mirror::leaf_traits<mirror::cuda::device_span<float>>::is_view);
  STATIC_REQUIRE(std::is_same_v<mirror::devices::Default, mirror::devices::Cuda>);
  STATIC_REQUIRE(mirror::device<mirror::devices::Cuda>);
  STATIC_REQUIRE(mirror::cross_device_ops<mirror::ops::ReductionToOneDevice, mirror::devices::Cuda>);
  STATIC_REQUIRE(mirror::cross_device_ops<mirror::ops::HierarchicalCopy, mirror::devices::Cuda>);
}

#if MIRROR_HAS_NCCL
TEST_CASE("nccl: the default ops on devices::Cuda, and settings NCCL cannot run", "[nccl][no_gpu]") {
  using mirror::ops::NcclAllReduce;
  STATIC_REQUIRE(std::is_same_v<mirror::default_ops_t<mirror::devices::Cuda>, NcclAllReduce>);
  STATIC_REQUIRE_FALSE(mirror::cross_device_ops<NcclAllReduce, mirror::devices::Threads>);
  REQUIRE(NcclAllReduce::refusal(1, 1).empty());
  REQUIRE(NcclAllReduce::refusal(0, 1).empty());
  const std::string shared = NcclAllReduce::refusal(1, 4);
  REQUIRE_THAT(shared, Catch::Contains("replicas_per_gpu = 4") && Catch::Contains("ReductionToOneDevice") &&
                           Catch::Contains("HierarchicalCopy"));
  REQUIRE(NcclAllReduce::refusal(1, 4, true).empty());  // NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1
  REQUIRE_THAT(NcclAllReduce::refusal(-1, 1), Catch::Contains("num_packs must be >= 0"));
}

TEST_CASE("nccl: TF's packing rule, the last pack takes the rest", "[nccl][no_gpu]") {
  using mirror::ops::NcclAllReduce;
  using R = std::pair<std::size_t, std::size_t>;
  REQUIRE(NcclAllReduce::pack_range(0, 3, 10) == R{0, 3});
  REQUIRE(NcclAllReduce::pack_range(1, 3, 10) == R{3, 6});
  REQUIRE(NcclAllReduce::pack_range(2, 3, 10) == R{6, 10});
  for (std::size_t i = 0; i < 7; ++i) REQUIRE(NcclAllReduce::pack_range(i, 8, 1) == R{0, 0});
  REQUIRE(NcclAllReduce::pack_range(7, 8, 1) == R{0, 1});
  REQUIRE(NcclAllReduce::pack_range(0, 1, 5) == R{0, 5});
}
#endif

// ---- device-resident leaves (docs/cuda.md#leaves): never read on the host ----

// Instantiated (so it must compile and link against libmirror_cuda) but only called with a GPU:
// reduce of a device-resident value goes through the replicas' all-reduce, not the host loop.
[[maybe_unused]] FakeDeviceVector reduce_device_value(mirror::Strategy<mirror::devices::Cuda>& s,
                                                      const mirror::PerReplica<FakeDeviceVector>& v) {
  return s.reduce(ReduceOp::sum, v);
}

TEST_CASE("cuda: device leaves are marked device_resident; host leaves are not", "[cuda][no_gpu]") {
  STATIC_REQUIRE(mirror::device_resident_leaf<mirror::cuda::device_span<float>>);
  STATIC_REQUIRE(mirror::device_resident_leaf<FakeDeviceVector>);
  STATIC_REQUIRE_FALSE(mirror::device_resident_leaf<std::vector<float>>);
  STATIC_REQUIRE_FALSE(mirror::device_resident_leaf<std::span<float>>);
  STATIC_REQUIRE_FALSE(mirror::device_resident_leaf<double>);
  STATIC_REQUIRE(mirror::detail::has_device_leaf<std::tuple<std::vector<float>, FakeDeviceVector>>());
  STATIC_REQUIRE_FALSE(mirror::detail::has_device_leaf<std::tuple<std::vector<float>, int>>());
  // What a variable or a batch-axis reduce would read on the host is rejected at compile time:
  // tests/fail/variable_of_device_leaves, reduce_axis0_device_leaf, device_leaf_on_host_device.
}

// ---- half and bfloat16 through Strategy (device leaves only: the host has no arithmetic) ----

template <class Ops, class E>
[[maybe_unused]] void all_reduce_16_bit(mirror::Strategy<mirror::devices::Cuda, Ops>& s,
                                        std::vector<mirror::cuda::device_span<E>>& spans) {
  s.run([&](auto& ctx) {
    (void)ctx.all_reduce(ReduceOp::mean, spans[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
    (void)ctx.broadcast(spans[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
  });
}
// Instantiated for every policy (compiled and linked in CI; run by tests/gpu on a GPU).
template void all_reduce_16_bit(mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice>&,
                                std::vector<mirror::cuda::device_span<mirror::cuda::half>>&);
template void all_reduce_16_bit(mirror::Strategy<mirror::devices::Cuda, mirror::ops::HierarchicalCopy>&,
                                std::vector<mirror::cuda::device_span<mirror::cuda::bfloat16>>&);
#if MIRROR_HAS_NCCL
template void all_reduce_16_bit(mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce>&,
                                std::vector<mirror::cuda::device_span<mirror::cuda::half>>&);
#endif

TEST_CASE("cuda: device_span of half and bfloat16 are leaves", "[cuda][no_gpu]") {
  STATIC_REQUIRE(mirror::leaf<mirror::cuda::device_span<mirror::cuda::half>>);
  STATIC_REQUIRE(mirror::leaf<mirror::cuda::device_span<mirror::cuda::bfloat16>>);
  STATIC_REQUIRE(mirror::device_resident_leaf<mirror::cuda::device_span<mirror::cuda::half>>);
  STATIC_REQUIRE_FALSE(mirror::leaf<mirror::cuda::device_span<const mirror::cuda::half>>);
}
