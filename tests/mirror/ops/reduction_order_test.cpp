// SPDX-License-Identifier: Apache-2.0
// Each ops policy combines replicas in the order its header documents, bit for bit: inputs are
// floats of mixed magnitudes and signs, so a sum in any other order rounds differently (the
// conformance suite's small integers are exact in every order and cannot tell). The reference
// for each policy is a serial loop written from its documentation, not from its code:
//   ReductionToOneDevice, ChunkOwnerAllReduce, Strategy::reduce: replicas 0, 1, ..., N-1.
//   HierarchicalCopy: per pack i (num_packs > 0: TF's split of the concatenated leaves; 0: one
//     pack per leaf), g = N / 2 and m0 = i % N; group A = [0, g) when m0 < g, else [g, N); group
//     B the other one; each group folded in replica order, then A op B (then / N for mean).
// And min and max are IEEE 754-2019's minimum and maximum under every policy: a NaN on any
// replica gives NaN, -0 is below +0, checked against std::fmin, std::fmax, std::isnan and
// std::signbit.

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/fake_device.hpp"
#include "support/reference.hpp"

namespace {

using mirror::ReduceOp;
using Leaves = std::tuple<std::vector<float>, std::vector<double>, std::vector<float>>;
// Leaf lengths: a short one, one across several packs and 8 KiB blocks, one odd tail.
constexpr std::size_t lengths[3] = {5, 2600, 37};

template <class E>
E mixed(std::mt19937& g, ReduceOp op) {
  if (op == ReduceOp::prod) return E(std::uniform_real_distribution<double>(0.7, 1.4)(g));
  const double m = std::pow(10.0, std::uniform_real_distribution<double>(-3, 3)(g));
  return E(std::uniform_int_distribution<int>(0, 1)(g) != 0 ? m : -m);
}

Leaves make_input(int replica, ReduceOp op) {
  std::mt19937 g(static_cast<unsigned>(1000 + 17 * replica + static_cast<int>(op)));
  Leaves l;
  std::get<0>(l).resize(lengths[0]);
  std::get<1>(l).resize(lengths[1]);
  std::get<2>(l).resize(lengths[2]);
  for (auto& x : std::get<0>(l)) x = mixed<float>(g, op);
  for (auto& x : std::get<1>(l)) x = mixed<double>(g, op);
  for (auto& x : std::get<2>(l)) x = mixed<float>(g, op);
  return l;
}

template <class E>
E apply(ReduceOp op, E a, E b) {  // the arithmetic of one step (min/max: only on non-NaN data here)
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::min: return std::fmin(a, b);
    case ReduceOp::max: return std::fmax(a, b);
  }
  return a;
}

/// Folds replicas [first, last) of element i of one leaf, in replica order.
template <class E>
E fold(ReduceOp op, const std::vector<const std::vector<E>*>& xs, int first, int last, std::size_t i) {
  E acc = (*xs[static_cast<std::size_t>(first)])[i];
  for (int r = first + 1; r < last; ++r) acc = apply(op, acc, (*xs[static_cast<std::size_t>(r)])[i]);
  return acc;
}

enum class order { replica, tree };

/// The documented reference of leaf `leaf` (index into Leaves) for all replicas' inputs.
template <std::size_t Leaf>
auto reference(ReduceOp op, const std::vector<Leaves>& in, order how, int num_packs) {
  using V = std::tuple_element_t<Leaf, Leaves>;
  using E = typename V::value_type;
  const int n = static_cast<int>(in.size());
  std::vector<const V*> xs;
  for (const Leaves& l : in) xs.push_back(&std::get<Leaf>(l));
  std::size_t offset = 0;  // of this leaf in the concatenation of the leaves of one element type
  if constexpr (Leaf == 2) offset = lengths[0];  // leaves 0 and 2 are the float ones
  std::size_t total = std::is_same_v<E, float> ? lengths[0] + lengths[2] : lengths[1];
  V out(xs[0]->size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    E acc;
    if (how == order::replica || n == 1) {
      acc = fold(op, xs, 0, n, i);
    } else {
      std::size_t pack = Leaf == 2 ? 1 : 0;  // num_packs == 0: one pack per leaf of the type
      if (num_packs > 0) {
        const std::size_t p = static_cast<std::size_t>(num_packs), per = total / p, e = offset + i;
        pack = per == 0 ? p - 1 : std::min(e / per, p - 1);
      }
      const int g = n / 2, m0 = static_cast<int>(pack % static_cast<std::size_t>(n));
      const bool low = m0 < g;
      const E a = low ? fold(op, xs, 0, g, i) : fold(op, xs, g, n, i);
      const E b = low ? fold(op, xs, g, n, i) : fold(op, xs, 0, g, i);
      acc = apply(op, a, b);
    }
    if (op == ReduceOp::mean) acc = acc / E(n);
    out[i] = acc;
  }
  return out;
}

template <class V>
bool bitwise_equal(const V& a, const V& b) {
  return a.size() == b.size() && mirror::test::same_bits(a.data(), b.data(), a.size());
}

template <class Device, class Ops>
void check_order(Ops ops, order how, int num_packs) {
  for (const int n : {2, 3, 5, 7, 8}) {
    mirror::Strategy<Device, Ops> s(mirror::test::make_device<Device>(n), ops);
    for (const auto op : mirror::test::all_ops) {
      CAPTURE(n, mirror::to_string(op));
      std::vector<Leaves> in;
      for (int r = 0; r < n; ++r) in.push_back(make_input(r, op));
      const auto out = s.run([&](auto& ctx) { return ctx.all_reduce(op, in[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]); });
      const auto r0 = reference<0>(op, in, how, num_packs);
      const auto r1 = reference<1>(op, in, how, num_packs);
      const auto r2 = reference<2>(op, in, how, num_packs);
      for (const Leaves& got : out) {
        REQUIRE(bitwise_equal(std::get<0>(got), r0));
        REQUIRE(bitwise_equal(std::get<1>(got), r1));
        REQUIRE(bitwise_equal(std::get<2>(got), r2));
      }
    }
  }
}

}  // namespace

using Threads = mirror::devices::Threads;
using Fake = mirror::test::FakeDevice;

TEST_CASE("order: ReductionToOneDevice folds replicas 0..N-1 wherever it reduces", "[ops][order][reduction_to_one_device]") {
  check_order<Threads>(mirror::ops::ReductionToOneDevice{}, order::replica, 0);
  check_order<Threads>(mirror::ops::ReductionToOneDevice{.reduce_to = 1}, order::replica, 0);
  check_order<Fake>(mirror::ops::ReductionToOneDevice{}, order::replica, 0);
}

TEST_CASE("order: ChunkOwnerAllReduce folds replicas 0..N-1", "[ops][order][chunk_owner]") {
  check_order<Threads>(mirror::ops::ChunkOwnerAllReduce{}, order::replica, 0);
}

TEST_CASE("order: HierarchicalCopy folds each group in order, then the group of m0 with the other",
          "[ops][order][hierarchical_copy]") {
  for (const int packs : {0, 1, 3}) {
    CAPTURE(packs);
    check_order<Threads>(mirror::ops::HierarchicalCopy{.num_packs = packs}, order::tree, packs);
    check_order<Fake>(mirror::ops::HierarchicalCopy{.num_packs = packs}, order::tree, packs);
  }
}

TEST_CASE("order: Strategy::reduce folds replicas 0..N-1", "[strategy][order][reduce]") {
  for (const int n : {2, 3, 7}) {
    mirror::Strategy<Threads> s(mirror::test::make_device<Threads>(n));
    for (const auto op : mirror::test::all_ops) {
      CAPTURE(n, mirror::to_string(op));
      std::vector<Leaves> in;
      for (int r = 0; r < n; ++r) in.push_back(make_input(r, op));
      const Leaves got = s.reduce(op, mirror::PerReplica<Leaves>(in));
      REQUIRE(bitwise_equal(std::get<0>(got), reference<0>(op, in, order::replica, 0)));
      REQUIRE(bitwise_equal(std::get<1>(got), reference<1>(op, in, order::replica, 0)));
      REQUIRE(bitwise_equal(std::get<2>(got), reference<2>(op, in, order::replica, 0)));
    }
  }
}

// ---- min and max: NaN and signed zeros ----

namespace {

/// min/max of every replica's element i, from std:: functions: NaN if any is NaN; otherwise
/// std::fmin / std::fmax, and for zeros of both signs -0 (min) or +0 (max).
template <class E>
E expected_extreme(ReduceOp op, const std::vector<std::vector<E>>& xs, std::size_t i) {
  bool nan = false, negative_zero = false, positive_zero = false;
  E acc = op == ReduceOp::min ? std::numeric_limits<E>::infinity() : -std::numeric_limits<E>::infinity();
  for (const auto& x : xs) {
    const E v = x[i];
    if (std::isnan(v)) nan = true;
    if (v == 0) (std::signbit(v) ? negative_zero : positive_zero) = true;
    acc = op == ReduceOp::min ? std::fmin(acc, v) : std::fmax(acc, v);
  }
  if (nan) return std::numeric_limits<E>::quiet_NaN();
  if (acc == 0 && negative_zero && positive_zero) return op == ReduceOp::min ? E(-0.0) : E(0.0);
  if (acc == 0) return negative_zero ? E(-0.0) : E(0.0);
  return acc;
}

template <class E>
bool same_extreme(E got, E want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

/// Replica r's input: NaNs, zeros of both signs, infinities and ordinary values, so that every
/// element sees a different mix, in every position among the replicas.
template <class E>
std::vector<E> specials(int r, std::size_t n) {
  std::vector<E> v(n);
  const E menu[] = {std::numeric_limits<E>::quiet_NaN(), E(-0.0), E(0.0), E(1.5), E(-2.25), std::numeric_limits<E>::infinity(),
                    -std::numeric_limits<E>::infinity(), E(0.0)};
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t k = (i * 7 + static_cast<std::size_t>(r) * 3 + (i / 8) * static_cast<std::size_t>(r)) % 8;
    // NaN in one element of 4, on one replica only (which one varies with i), else ordinary
    v[i] = menu[k == 0 && (i + static_cast<std::size_t>(r)) % 4 != 0 ? 1 : k];
  }
  return v;
}

template <class E, class Device, class Ops>
void check_extremes(Ops ops) {
  for (const int n : {2, 3, 4, 7}) {
    mirror::Strategy<Device, Ops> s(mirror::test::make_device<Device>(n), ops);
    for (const auto op : {ReduceOp::min, ReduceOp::max}) {
      for (const std::size_t len : {std::size_t{1}, std::size_t{3}, std::size_t{70}, std::size_t{3001}}) {
        CAPTURE(n, mirror::to_string(op), len);
        std::vector<std::vector<E>> in;
        for (int r = 0; r < n; ++r) in.push_back(specials<E>(r, len));
        const auto out = s.run([&](auto& ctx) { return ctx.all_reduce(op, in[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]); });
        const std::vector<E> host = s.reduce(op, mirror::PerReplica<std::vector<E>>(in));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < len; ++i) {
          const E want = expected_extreme(op, in, i);
          for (const auto& copy : out) wrong += same_extreme(copy[i], want) ? 0 : 1;
          wrong += same_extreme(host[i], want) ? 0 : 1;
        }
        REQUIRE(wrong == 0);
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("min and max: a NaN on any replica gives NaN, -0 is below +0, under every policy",
                   "[ops][min_max]", float, double) {
  using E = TestType;
  check_extremes<E, Threads>(mirror::ops::ChunkOwnerAllReduce{});
  check_extremes<E, Threads>(mirror::ops::ReductionToOneDevice{});
  check_extremes<E, Threads>(mirror::ops::HierarchicalCopy{.num_packs = 2});
  check_extremes<E, Fake>(mirror::ops::ReductionToOneDevice{.reduce_to = 1});
  check_extremes<E, Fake>(mirror::ops::HierarchicalCopy{.num_packs = 0});
}

TEST_CASE("min and max with axis0 and on sync-on-read reads follow the same rule", "[strategy][min_max]") {
  mirror::Strategy<Threads> s(mirror::test::make_device<Threads>(3));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const mirror::PerReplica<std::vector<float>> batches({{1.0f, 0.0f}, {nan}, {-0.0f, 2.0f}});
  REQUIRE(std::isnan(s.reduce(ReduceOp::min, batches, mirror::axis0)));
  REQUIRE(std::isnan(s.reduce(ReduceOp::max, batches, mirror::axis0)));
  const mirror::PerReplica<std::vector<float>> zeros({{0.0f}, {-0.0f, 0.0f}, {}});
  const float lo = s.reduce(ReduceOp::min, zeros, mirror::axis0), hi = s.reduce(ReduceOp::max, zeros, mirror::axis0);
  REQUIRE((lo == 0.0f && std::signbit(lo)));
  REQUIRE((hi == 0.0f && !std::signbit(hi)));
}
