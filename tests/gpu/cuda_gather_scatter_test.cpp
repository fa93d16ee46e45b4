// SPDX-License-Identifier: Apache-2.0
// ctx.reduce_scatter and ctx.all_gather on devices::Cuda under every GPU policy: NcclAllReduce
// (one replica per GPU: counts above the GPU count are skipped, so one GPU runs R = 1, a
// single-rank communicator), ReductionToOneDevice and HierarchicalCopy (R replicas on R GPUs
// when there are that many, else logical replicas on GPU 0). Against serial references
// (tests/support/reference.hpp: small-integer inputs, exact in every order, so every policy's
// cut must equal the reference's bit for bit, except NCCL's pre-multiplied float mean), and
// against the same policy's all_reduce on inputs that are not exact. Without a GPU: SKIP.
#include "gpu/cuda_support.hpp"

#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::ReduceOp;

namespace {

template <class Ops>
constexpr bool is_nccl() {
#if MIRROR_HAS_NCCL
  return std::is_same_v<Ops, mirror::ops::NcclAllReduce>;
#else
  return false;
#endif
}

// NCCL needs one GPU per replica; the copy-based policies run any count on one GPU.
template <class Ops>
bool supports(int R) {
  return !is_nccl<Ops>() || R <= mirror::cuda::device_count();
}

template <class Ops>
mirror::Strategy<mirror::devices::Cuda, Ops>& strategy_with(int R) {
  static std::array<std::unique_ptr<mirror::Strategy<mirror::devices::Cuda, Ops>>, 17> cache;
  auto& s = cache[static_cast<std::size_t>(R)];
  if (!s) s = std::make_unique<mirror::Strategy<mirror::devices::Cuda, Ops>>(mirror::test::make_device<mirror::devices::Cuda>(R), Ops{});
  return *s;
}

constexpr int counts_to_try[] = {1, 2, 3, 4, 7};

// NCCL's float mean is ncclAvg, sum_r x_r * (1/R): with 1/R inexact (R not a power of two) its
// last bits may differ from the serial (sum)/R; within (R + 1) eps of the inputs' scale.
template <class Ops, class T>
bool matches(ReduceOp op, int R, const T* got, const T* want, std::size_t n) {
  if (!(is_nccl<Ops>() && op == ReduceOp::mean && std::is_floating_point_v<T> && (R & (R - 1)) != 0)) {
    return mirror::test::same_bits(got, want, n);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (std::abs(double(got[i]) - double(want[i])) > double(R + 1) * double(std::numeric_limits<T>::epsilon()) * 64.0) {
      return false;
    }
  }
  return true;
}

template <class Ops, class T>
void reduce_scatter_against_reference() {
  for (const int R : counts_to_try) {
    if (!supports<Ops>(R)) continue;
    auto& s = strategy_with<Ops>(R);
    // (Few sizes: the kit runs this program whole under compute-sanitizer's memcheck too.)
    const std::size_t sizes[] = {0, 1, 3, static_cast<std::size_t>(R - 1), static_cast<std::size_t>(5 * R + 1), 1009,
                                 (std::size_t{1} << 16) + 1};
    for (const std::size_t n : sizes) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        const std::vector<T> want = mirror::test::serial_reference<T>(op, R, n);
        std::vector<std::vector<T>> inputs(static_cast<std::size_t>(R));
        for (int r = 0; r < R; ++r) inputs[static_cast<std::size_t>(r)] = mirror::test::input_vector<T>(op, r, n);
        const auto out = s.run([&](auto& ctx) {
          return ctx.reduce_scatter(op, inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
        });
        for (int r = 0; r < R; ++r) {
          CAPTURE(r);
          const auto [first, count] = mirror::backend::cut_of(n, R, r);
          const std::vector<T>& got = out[static_cast<std::size_t>(r)];
          REQUIRE(got.size() == count);
          REQUIRE(matches<Ops>(op, R, got.data(), want.data() + first, count));
        }
      }
    }
  }
}

// Leaves in device memory, reduced in place: an exact multiple of R (NCCL reduce-scatters the
// leaf itself) and a ragged length (NCCL goes through the padded scratch).
template <class Ops>
void reduce_scatter_in_place_on_device() {
  for (const int R : counts_to_try) {
    if (!supports<Ops>(R)) continue;
    auto& s = strategy_with<Ops>(R);
    for (const std::size_t n : {static_cast<std::size_t>(1000 * R), static_cast<std::size_t>(1000 * R + 1)}) {
      CAPTURE(R, n);
      const std::vector<float> want = mirror::test::serial_reference<float>(ReduceOp::sum, R, n);
      std::vector<mirror::cuda::device_buffer<float>> buffers;
      std::vector<std::vector<float>> pristine;
      for (int r = 0; r < R; ++r) {
        pristine.push_back(mirror::test::input_vector<float>(ReduceOp::sum, r, n));
        buffers.emplace_back(s.runtime().device_of(r), n);
        buffers.back().upload(pristine.back());
      }
      s.run([&](auto& ctx) {
        auto& b = buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
        const auto d = b.span();
        (void)ctx.reduce_scatter(ReduceOp::sum, std::span<float>(d.data, d.size));
      });
      for (int r = 0; r < R; ++r) {
        s.runtime().synchronize(r);
        std::vector<float> got(n);
        buffers[static_cast<std::size_t>(r)].download(got);
        const auto [first, count] = mirror::backend::cut_of(n, R, r);
        std::vector<float> expect = pristine[static_cast<std::size_t>(r)];
        std::copy_n(want.begin() + static_cast<std::ptrdiff_t>(first), count,
                    expect.begin() + static_cast<std::ptrdiff_t>(first));
        CAPTURE(r);
        REQUIRE(mirror::test::same_bits(got.data(), expect.data(), n));
      }
    }
  }
}

// Inputs that are not exact (random floats): each cut must have the bits of the same elements of
// the policy's all_reduce. NcclAllReduce guarantees that for one or two replicas and for min/max
// only (backends/nccl/nccl_all_reduce.hpp); the copy-based policies always.
template <class Ops>
void reduce_scatter_matches_all_reduce() {
  std::mt19937 gen(31);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const int R : counts_to_try) {
    if (!supports<Ops>(R)) continue;
    auto& s = strategy_with<Ops>(R);
    for (const std::size_t n : {std::size_t{1}, static_cast<std::size_t>(3 * R + 2), std::size_t{100003}}) {
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(R), std::vector<float>(n));
      for (auto& v : inputs) {
        for (float& x : v) x = dist(gen);
      }
      for (const auto op : mirror::test::all_ops) {
        if (is_nccl<Ops>() && R > 2 && op != ReduceOp::min && op != ReduceOp::max) continue;
        CAPTURE(R, n, mirror::to_string(op));
        const auto reduced = s.run([&](auto& ctx) {
          return ctx.all_reduce(op, inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
        });
        const auto cuts = s.run([&](auto& ctx) {
          return ctx.reduce_scatter(op, inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
        });
        const std::vector<float> all = reduced.primary();
        for (int r = 0; r < R; ++r) {
          const auto [first, count] = mirror::backend::cut_of(n, R, r);
          CAPTURE(r);
          REQUIRE(cuts[static_cast<std::size_t>(r)].size() == count);
          REQUIRE(mirror::test::same_bits(cuts[static_cast<std::size_t>(r)].data(), all.data() + first, count));
        }
      }
    }
  }
}

template <class Ops, class T>
void all_gather_against_reference() {
  for (const int R : counts_to_try) {
    if (!supports<Ops>(R)) continue;
    auto& s = strategy_with<Ops>(R);
    // Replica r: `uneven` has r * 37 + 1 elements (NCCL: a broadcast per replica), `even` 4099
    // (NCCL: one ncclAllGather), `sometimes` is empty on even replicas; and a scalar.
    auto uneven = [](int r) { return mirror::test::input_vector<T>(ReduceOp::sum, r, static_cast<std::size_t>(r) * 37 + 1); };
    auto even = [](int r) { return mirror::test::input_vector<T>(ReduceOp::max, r, 4099); };
    auto sometimes = [](int r) { return r % 2 == 1 ? mirror::test::input_vector<T>(ReduceOp::min, r, 5) : std::vector<T>{}; };
    CAPTURE(R);
    const auto out = s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      return ctx.all_gather(std::tuple{uneven(r), even(r), sometimes(r), static_cast<T>(r + 1)}, mirror::axis0);
    });
    std::vector<T> want_uneven, want_even, want_sometimes, want_scalar;
    for (int r = 0; r < R; ++r) {
      for (const T x : uneven(r)) want_uneven.push_back(x);
      for (const T x : even(r)) want_even.push_back(x);
      for (const T x : sometimes(r)) want_sometimes.push_back(x);
      want_scalar.push_back(static_cast<T>(r + 1));
    }
    for (int r = 0; r < R; ++r) {
      CAPTURE(r);
      const auto& [a, b, c, d] = out[static_cast<std::size_t>(r)];
      REQUIRE(a == want_uneven);
      REQUIRE(b == want_even);
      REQUIRE(c == want_sometimes);
      REQUIRE(d == want_scalar);
    }
  }
}

// The span form with device memory on both sides: no staging, NCCL writes the caller's buffer.
template <class Ops>
void all_gather_spans_on_device() {
  for (const int R : counts_to_try) {
    if (!supports<Ops>(R)) continue;
    auto& s = strategy_with<Ops>(R);
    for (const bool equal : {true, false}) {
      CAPTURE(R, equal);
      auto length = [&](int r) { return equal ? std::size_t{3000} : static_cast<std::size_t>(1000 + 17 * r); };
      std::size_t total = 0;
      std::vector<float> want;
      std::vector<mirror::cuda::device_buffer<float>> ins, outs;
      for (int r = 0; r < R; ++r) {
        const auto mine = mirror::test::input_vector<float>(ReduceOp::sum, r, length(r));
        want.insert(want.end(), mine.begin(), mine.end());
        total += mine.size();
        ins.emplace_back(s.runtime().device_of(r), mine.size());
        ins.back().upload(mine);
      }
      for (int r = 0; r < R; ++r) outs.emplace_back(s.runtime().device_of(r), total);
      s.run([&](auto& ctx) {
        const auto me = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
        const auto i = ins[me].span();
        const auto o = outs[me].span();
        ctx.all_gather(std::span<const float>(i.data, i.size), std::span<float>(o.data, o.size), mirror::axis0);
      });
      for (int r = 0; r < R; ++r) {
        s.runtime().synchronize(r);
        std::vector<float> got(total);
        outs[static_cast<std::size_t>(r)].download(got);
        CAPTURE(r);
        REQUIRE(got == want);
      }
    }
  }
}

}  // namespace

#if MIRROR_HAS_NCCL
#define GATHER_SCATTER_POLICIES mirror::ops::NcclAllReduce, mirror::ops::ReductionToOneDevice, mirror::ops::HierarchicalCopy
#else
#define GATHER_SCATTER_POLICIES mirror::ops::ReductionToOneDevice, mirror::ops::HierarchicalCopy
#endif

TEMPLATE_TEST_CASE("cuda: reduce_scatter gives each replica its cut of the serial reference, every op, element type "
                   "and length", "[cuda][gather_scatter]", GATHER_SCATTER_POLICIES) {
  reduce_scatter_against_reference<TestType, float>();
  reduce_scatter_against_reference<TestType, double>();
  reduce_scatter_against_reference<TestType, std::int32_t>();
  reduce_scatter_against_reference<TestType, std::int64_t>();
}

TEMPLATE_TEST_CASE("cuda: reduce_scatter of device spans is in place in the replica's cut, the rest untouched",
                   "[cuda][gather_scatter]", GATHER_SCATTER_POLICIES) {
  reduce_scatter_in_place_on_device<TestType>();
}

TEMPLATE_TEST_CASE("cuda: reduce_scatter has the bits of the same elements of the policy's all_reduce",
                   "[cuda][gather_scatter]", GATHER_SCATTER_POLICIES) {
  reduce_scatter_matches_all_reduce<TestType>();
}

TEMPLATE_TEST_CASE("cuda: all_gather concatenates every replica's leaves in replica order, equal and unequal lengths",
                   "[cuda][gather_scatter]", GATHER_SCATTER_POLICIES) {
  all_gather_against_reference<TestType, float>();
  all_gather_against_reference<TestType, std::int64_t>();
}

TEMPLATE_TEST_CASE("cuda: all_gather of device spans writes the caller's device buffer", "[cuda][gather_scatter]",
                   GATHER_SCATTER_POLICIES) {
  all_gather_spans_on_device<TestType>();
}
