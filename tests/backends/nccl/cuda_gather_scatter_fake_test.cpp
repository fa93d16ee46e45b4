// SPDX-License-Identifier: Apache-2.0
// ctx.reduce_scatter and ctx.all_gather on Strategy<devices::Cuda> without a GPU: the real
// cuda_runtime.cpp and nccl_comms.cpp against the scripted CUDA runtime and NCCL of
// tests/support/fake_nccl.cpp, three "GPUs" of host memory, one replica on each (NCCL's rule). For
// ops::NcclAllReduce this runs its header (cuts, scratch, the leaves of each element type in one
// NCCL group) above the calls nccl_comms_fake_test checks; for ReductionToOneDevice and
// HierarchicalCopy, the generic gather and scatter through the CUDA runtime's peer copies and
// kernels. Results against the serial reference (tests/support/reference.hpp), whose cut r is what
// replica r must receive: the fake folds ranks in order, so every op is exact here.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>  // the fake's cudaSetDevice and cudaMalloc (tests/support/fake_nccl.cpp)

#include <cstdint>
#include <stdexcept>
#include <string>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/fake_nccl.hpp"
#include "support/reference.hpp"

using mirror::ReduceOp;

namespace {

constexpr int replicas = 3;

void require_rules_kept() {
  const auto r = fake_nccl::snapshot();
  for (const auto& v : r.violations) FAIL_CHECK(v);
  REQUIRE(r.violations.empty());
}

template <class T>
std::vector<T> cut(const std::vector<T>& v, int r) {
  const auto [first, count] = mirror::backend::cut_of(v.size(), replicas, r);
  return {v.begin() + static_cast<std::ptrdiff_t>(first), v.begin() + static_cast<std::ptrdiff_t>(first + count)};
}

template <class Ops>
mirror::Strategy<mirror::devices::Cuda, Ops> make_strategy() {
  return mirror::Strategy<mirror::devices::Cuda, Ops>{{.gpus = {0, 1, 2}}, Ops{}};
}

}  // namespace

TEMPLATE_TEST_CASE("cuda (fake GPUs): reduce_scatter of vectors of two element types is each replica's cut of the "
                   "serial reference, every op, empty, short and ragged lengths",
                   "[cuda][nccl][fake]", mirror::ops::NcclAllReduce, mirror::ops::ReductionToOneDevice,
                   mirror::ops::HierarchicalCopy) {
  fake_nccl::reset({.devices = replicas});
  {
    auto s = make_strategy<TestType>();
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7},
                                std::size_t{12}, std::size_t{50}}) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(n, mirror::to_string(op));
        // (NCCL's mean of floats pre-multiplies: mirror::test::nccl_reference.)
        const auto want_f = std::is_same_v<TestType, mirror::ops::NcclAllReduce>
                                ? mirror::test::nccl_reference<float>(op, replicas, n)
                                : mirror::test::serial_reference<float>(op, replicas, n);
        const auto want_i = mirror::test::serial_reference<std::int64_t>(op, replicas, n + 1);
        const auto out = s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          return ctx.reduce_scatter(op, std::tuple{mirror::test::input_vector<float>(op, r, n),
                                                   mirror::test::input_vector<std::int64_t>(op, r, n + 1)});
        });
        // (A nest of plain values returned from fn: a nest of PerReplica.)
        const auto& [f, i] = out;
        for (int r = 0; r < replicas; ++r) {
          CAPTURE(r);
          REQUIRE(f[static_cast<std::size_t>(r)] == cut(want_f, r));
          REQUIRE(i[static_cast<std::size_t>(r)] == cut(want_i, r));
        }
      }
    }
  }
  if constexpr (std::is_same_v<TestType, mirror::ops::NcclAllReduce>) {
    REQUIRE(fake_nccl::snapshot().reduce_scatter_calls > 0);  // NCCL ran it, not a fallback
  }
  require_rules_kept();
}

TEMPLATE_TEST_CASE("cuda (fake GPUs): reduce_scatter of a span reduces in place into the replica's cut and leaves "
                   "the rest of the span as it was",
                   "[cuda][nccl][fake]", mirror::ops::NcclAllReduce, mirror::ops::ReductionToOneDevice,
                   mirror::ops::HierarchicalCopy) {
  fake_nccl::reset({.devices = replicas});
  {
    auto s = make_strategy<TestType>();
    for (const std::size_t n : {std::size_t{5}, std::size_t{9}, std::size_t{31}}) {
      CAPTURE(n);
      const auto want = mirror::test::serial_reference<float>(ReduceOp::sum, replicas, n);
      std::vector<std::vector<float>> buffers;
      for (int r = 0; r < replicas; ++r) buffers.push_back(mirror::test::input_vector<float>(ReduceOp::sum, r, n));
      const auto pristine = buffers;
      std::vector<std::size_t> view_offsets(replicas), view_sizes(replicas);
      s.run([&](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        auto& mine = buffers[static_cast<std::size_t>(r)];
        const std::span<float> view = ctx.reduce_scatter(ReduceOp::sum, std::span<float>(mine));
        view_offsets[static_cast<std::size_t>(r)] = static_cast<std::size_t>(view.data() - mine.data());
        view_sizes[static_cast<std::size_t>(r)] = view.size();
      });
      for (int r = 0; r < replicas; ++r) {
        CAPTURE(r);
        const auto [first, count] = mirror::backend::cut_of(n, replicas, r);
        REQUIRE(view_offsets[static_cast<std::size_t>(r)] == first);
        REQUIRE(view_sizes[static_cast<std::size_t>(r)] == count);
        std::vector<float> expect = pristine[static_cast<std::size_t>(r)];
        std::copy(want.begin() + static_cast<std::ptrdiff_t>(first),
                  want.begin() + static_cast<std::ptrdiff_t>(first + count),
                  expect.begin() + static_cast<std::ptrdiff_t>(first));
        REQUIRE(buffers[static_cast<std::size_t>(r)] == expect);
      }
    }
  }
  require_rules_kept();
}

TEMPLATE_TEST_CASE("cuda (fake GPUs): all_gather concatenates every replica's leaves in replica order, equal and "
                   "unequal lengths, scalars and the span form",
                   "[cuda][nccl][fake]", mirror::ops::NcclAllReduce, mirror::ops::ReductionToOneDevice,
                   mirror::ops::HierarchicalCopy) {
  fake_nccl::reset({.devices = replicas});
  {
    auto s = make_strategy<TestType>();
    // Replica r: a vector of r + 1 doubles (unequal: NCCL broadcasts), 4 ints (equal: one
    // ncclAllGather), an empty vector on even replicas, and a scalar.
    auto vec_of = [](int r) {
      std::vector<double> v(static_cast<std::size_t>(r) + 1);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 10.0 * r + static_cast<double>(i);
      return v;
    };
    auto ints_of = [](int r) { return std::vector<std::int32_t>{r, -r, 100 + r, 7}; };
    auto odd_of = [](int r) { return r % 2 == 1 ? std::vector<float>{0.5f * r, 1.5f} : std::vector<float>{}; };
    const auto out = s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_gather(std::tuple{vec_of(r), ints_of(r), odd_of(r), 2.5f * r}, mirror::axis0);
    });
    std::vector<double> want_vec;
    std::vector<std::int32_t> want_ints;
    std::vector<float> want_odd, want_scalar;
    for (int r = 0; r < replicas; ++r) {
      for (const double x : vec_of(r)) want_vec.push_back(x);
      for (const std::int32_t x : ints_of(r)) want_ints.push_back(x);
      for (const float x : odd_of(r)) want_odd.push_back(x);
      want_scalar.push_back(2.5f * r);
    }
    for (int r = 0; r < replicas; ++r) {
      CAPTURE(r);
      const auto& [v, i, o, sc] = out[static_cast<std::size_t>(r)];
      REQUIRE(v == want_vec);
      REQUIRE(i == want_ints);
      REQUIRE(o == want_odd);
      REQUIRE(sc == want_scalar);
    }
    // The span form, unequal lengths, into a caller's buffer.
    std::vector<std::vector<double>> outs(replicas, std::vector<double>(want_vec.size(), -1.0));
    s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const auto mine = vec_of(r);
      ctx.all_gather(std::span<const double>(mine), std::span<double>(outs[static_cast<std::size_t>(r)]),
                     mirror::axis0);
    });
    for (const auto& o : outs) REQUIRE(o == want_vec);
  }
  if constexpr (std::is_same_v<TestType, mirror::ops::NcclAllReduce>) {
    const auto seen = fake_nccl::snapshot();
    REQUIRE(seen.all_gather_calls > 0);
    REQUIRE(seen.broadcast_calls > 0);
  }
  require_rules_kept();
}

TEST_CASE("cuda (fake GPUs): NcclAllReduce refuses a device leaf on another replica's GPU, naming both GPUs",
          "[cuda][nccl][fake]") {
  fake_nccl::reset({.devices = replicas});
  {
    auto s = make_strategy<mirror::ops::NcclAllReduce>();
    // Replica 1's leaf is memory of GPU 2 (replica 2's): NCCL on GPU 1 would work on another
    // GPU's memory through peer access, racing replica 2's own collective on it.
    std::vector<float*> memory(replicas, nullptr);
    for (int d = 0; d < replicas; ++d) {
      REQUIRE(cudaSetDevice(d) == cudaSuccess);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&memory[static_cast<std::size_t>(d)]), 16 * sizeof(float)) ==
              cudaSuccess);
    }
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    for (const int verb : {0, 1}) {
      CAPTURE(verb);
      try {
        s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          float* mine = memory[static_cast<std::size_t>(r == 1 ? 2 : r)];
          const mirror::cuda::device_span<float> leaf(mine, 16);
          if (verb == 0) ctx.all_reduce(ReduceOp::sum, leaf);
          if (verb == 1) ctx.reduce_scatter(ReduceOp::sum, leaf);
        });
        FAIL("no error");
      } catch (const mirror::replica_error& e) {  // run's wrapping of replica 1's invalid_argument
        const std::string what = e.what();
        CHECK(e.replica() == 1);
        CHECK_THAT(what, Catch::Contains("on replica 1: leaf 0"));
        CHECK_THAT(what, Catch::Contains("memory of GPU 2"));
        CHECK_THAT(what, Catch::Contains("runs on GPU 1"));
        CHECK_THROWS_AS(e.rethrow_nested(), std::invalid_argument);
      }
    }
    const auto r = fake_nccl::snapshot();
    CHECK(r.all_reduce_calls + r.reduce_scatter_calls == 0);  // refused before NCCL
    for (float* p : memory) (void)cudaFree(p);
  }
  require_rules_kept();
}
