// SPDX-License-Identifier: Apache-2.0
// The laws of reduce_scatter, all_gather, strategy.gather and distribute_values_from_function
// (docs/guide.md#collectives-inside-run) every (device, ops) pair must satisfy, written once. A
// test file defines the same macros as for tests/conformance/all_reduce_suite.hpp:
//   CONFORMANCE_DEVICE, CONFORMANCE_OPS, CONFORMANCE_TAG, and optionally CONFORMANCE_SUPPORTS(R)
//   and CONFORMANCE_MEAN_IS_PREMUL_SUM (the serial check of a floating mean then allows that
//   formula's rounding; the check against all_reduce stays bitwise)
// and includes this file (after all_reduce_suite.hpp or alone).
//
// References are independent of mirror: cuts are computed here by the batch-split rule
// (first n mod R replicas one element more), reductions by the serial loop of
// tests/support/reference.hpp, concatenations by plain loops.

#include <boost/hana/define_struct.hpp>
#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/reference.hpp"

#include "conformance/suite_strategy.hpp"

namespace gather_scatter {

using conformance::Device;
using conformance::Ops;
using conformance::Strategy;
using conformance::strategy_with;
using mirror::ReduceOp;

inline constexpr int replica_counts[] = {1, 2, 3, 4, 7, 8, 16};

/// The cut of n elements replica r of R receives, {first, count}: the first n mod R replicas
/// get n / R + 1 elements, the others n / R (written out here, not mirror's backend::cut_of).
struct cut {
  std::size_t first, count;
};
inline cut cut_for(std::size_t n, int R, int r) {
  const std::size_t q = n / static_cast<std::size_t>(R), m = n % static_cast<std::size_t>(R);
  std::size_t first = 0;
  for (int i = 0; i < r; ++i) first += q + (static_cast<std::size_t>(i) < m ? 1 : 0);
  return {first, q + (static_cast<std::size_t>(r) < m ? 1 : 0)};
}

/// The lengths a leaf of reduce_scatter is tried with on R replicas: 0, 1, fewer than R (some
/// replicas get nothing), a whole multiple of R, ragged ones (n mod R != 0), and large.
inline std::vector<std::size_t> scatter_lengths(int R) {
  const auto r = static_cast<std::size_t>(R);
  std::vector<std::size_t> n = {0, 1, 3 * r, 5 * r + 1, 1009, mirror::test::large_size};
  if (R > 2) n.push_back(r - 1);
  if (R > 3) n.push_back(7 * r + r / 2);
  return n;
}

/// Floating values of mixed magnitudes (and signs), whose sums round differently in another
/// order; small integers for integer types (any order gives the same bits there).
template <class T>
std::vector<T> inexact_input(ReduceOp op, int r, std::size_t n, unsigned seed) {
  if constexpr (std::is_floating_point_v<T>) {
    // 1021 random values (a prime period: no replica count or pack boundary lines up with it),
    // repeated: cheap for the large lengths, and still a different value at every offset of a cut
    std::mt19937 g(seed * 131u + static_cast<unsigned>(r));
    std::uniform_real_distribution<double> exponent(op == ReduceOp::prod ? -0.5 : -4.0, op == ReduceOp::prod ? 0.5 : 4.0);
    std::vector<T> v(std::min<std::size_t>(n, 1021));
    for (auto& x : v) x = static_cast<T>((g() % 2 != 0 ? 1 : -1) * std::pow(10.0, exponent(g)));
    v.resize(n);
    for (std::size_t i = 1021; i < n; ++i) v[i] = v[i - 1021];
    return v;
  } else {
    return mirror::test::input_vector<T>(op, r, n);
  }
}

/// Bitwise, except a floating mean of a pair whose mean is NCCL's pre-multiplied sum
/// (all_reduce_suite.hpp, CONFORMANCE_MEAN_IS_PREMUL_SUM): within that formula's rounding.
template <class T>
bool matches_reference(ReduceOp op, int R, const T* got, const T* want, std::size_t n) {
  if (!(CONFORMANCE_MEAN_IS_PREMUL_SUM != 0 && op == ReduceOp::mean && std::is_floating_point_v<T> &&
        (R & (R - 1)) != 0)) {
    return mirror::test::same_bits(got, want, n);
  }
  for (std::size_t i = 0; i < n; ++i) {
    // reference inputs are at most 9 in magnitude
    if (std::abs(double(got[i]) - double(want[i])) > double(R + 1) * double(std::numeric_limits<T>::epsilon()) * 9.0)
      return false;
  }
  return true;
}

/// Replica r's element i of an int leaf: -1, 0 or 1 (products of 16 stay in range), -1 first.
inline std::int32_t small_int(int r, std::size_t i) { return static_cast<std::int32_t>((i + static_cast<std::size_t>(r) * 2) % 3) - 1; }

/// Replica r's leaf for the all_gather tests: (r * 3 + salt) % 5 elements (replica 0 has none
/// when salt is 0), element i = r * 1000 + i + salt.
template <class T>
std::vector<T> gather_piece(int r, int salt) {
  std::vector<T> v(static_cast<std::size_t>((r * 3 + salt) % 5));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(r * 1000 + static_cast<int>(i) + salt);
  return v;
}

/// The pieces of replicas 0..R-1, one after another.
template <class T>
std::vector<T> concatenation(int R, int salt) {
  std::vector<T> out;
  for (int r = 0; r < R; ++r) {
    const auto p = gather_piece<T>(r, salt);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

struct Grads {  // a Hana struct of 1-D leaves: reduce_scatter keeps its type
  BOOST_HANA_DEFINE_STRUCT(Grads, (std::vector<float>, w), (std::span<double>, d), (std::vector<std::int32_t>, steps));
};

struct Owned {  // a Hana struct whose every leaf grows: all_gather keeps its type
  BOOST_HANA_DEFINE_STRUCT(Owned, (std::vector<float>, w), (mirror::matrix<double>, m), (std::vector<std::int64_t>, ids));
};

/// Runs fn on every replica expecting a shape_error from each; returns how many replicas raised
/// it and the message run rethrew.
template <class Fn>
std::pair<int, std::string> shape_errors(Strategy& s, Fn fn) {
  std::atomic<int> raised{0};
  std::string message;
  try {
    s.run([&](auto& ctx) {
      try {
        fn(ctx);
      } catch (const mirror::shape_error&) {
        ++raised;
        throw;
      }
    });
  } catch (const mirror::shape_error& e) {
    message = e.what();
  }
  return {raised.load(), message};
}

}  // namespace gather_scatter

// ------------------------------------------------------------------------------------------------
// reduce_scatter
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("conformance: reduce_scatter gives each replica its cut of a serial reference",
                   CONFORMANCE_TAG, float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  namespace gs = gather_scatter;
  for (const int R : gs::replica_counts) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    for (const std::size_t n : gs::scatter_lengths(R)) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        const std::vector<T> expected = mirror::test::serial_reference<T>(op, R, n);
        std::vector<std::vector<T>> inputs(static_cast<std::size_t>(R));
        for (int r = 0; r < R; ++r) inputs[static_cast<std::size_t>(r)] = mirror::test::input_vector<T>(op, r, n);
        const auto pristine = inputs;
        std::atomic<int> wrong{0};
        const mirror::PerReplica<std::vector<T>> cuts = s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          std::vector<T> mine = ctx.reduce_scatter(op, inputs[static_cast<std::size_t>(r)]);
          const auto c = gs::cut_for(n, R, r);
          if (mine.size() != c.count ||
              !gs::matches_reference(op, R, mine.data(), expected.data() + c.first, c.count))
            ++wrong;
          return mine;
        });
        REQUIRE(wrong == 0);
        REQUIRE(inputs == pristine);  // vector leaves are only read
        // returned from fn, the cuts form a PerReplica whose concatenation is the whole reduction
        std::size_t total = 0;
        for (const auto& c : cuts) total += c.size();
        REQUIRE(total == n);
      }
    }
  }
}

TEMPLATE_TEST_CASE("conformance: reduce_scatter has the bits of the same cut of all_reduce, for inexact inputs",
                   CONFORMANCE_TAG, float, double) {
  // Floats of mixed magnitudes round differently in every order of addition, so this fails for
  // a policy whose reduce_scatter folds an element in another order than its all_reduce (for
  // HierarchicalCopy: group 0 in order, group 1 in order, then group 0 op group 1, per pack).
  // (Integer results do not depend on the order: the serial check above covers them.)
  using T = TestType;
  namespace gs = gather_scatter;
  unsigned seed = 1;
  for (const int R : gs::replica_counts) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    for (const std::size_t n : gs::scatter_lengths(R)) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        ++seed;
        std::vector<std::vector<T>> inputs(static_cast<std::size_t>(R));
        for (int r = 0; r < R; ++r) inputs[static_cast<std::size_t>(r)] = gs::inexact_input<T>(op, r, n, seed);
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          const auto& x = inputs[static_cast<std::size_t>(r)];
          const auto whole = ctx.all_reduce(op, x);
          const std::vector<T> mine = ctx.reduce_scatter(op, x);
          const auto c = gs::cut_for(n, R, r);
          if (mine.size() != c.count || !mirror::test::same_bits(mine.data(), whole->data() + c.first, c.count)) ++wrong;
        });
        REQUIRE(wrong == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("conformance: reduce_scatter of a span reduces the cut in place and leaves the rest",
                   CONFORMANCE_TAG, float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    const auto u = static_cast<std::size_t>(R);
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, u > 1 ? u - 1 : 2, 5 * u + 1, std::size_t{4099}}) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        const std::vector<T> expected = mirror::test::serial_reference<T>(op, R, n);
        std::vector<std::vector<T>> buffers(u);
        for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)] = mirror::test::input_vector<T>(op, r, n);
        const auto before = buffers;
        std::atomic<int> views_cut{0};
        s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          auto& mine = buffers[static_cast<std::size_t>(r)];
          const std::span<T> out = ctx.reduce_scatter(op, std::span<T>(mine));
          const auto c = gs::cut_for(n, R, r);
          if (out.data() == mine.data() + c.first && out.size() == c.count) ++views_cut;
        });
        REQUIRE(views_cut == R);
        for (int r = 0; r < R; ++r) {
          CAPTURE(r);
          const auto& b = buffers[static_cast<std::size_t>(r)];
          const auto& orig = before[static_cast<std::size_t>(r)];
          const auto c = gs::cut_for(n, R, r);
          REQUIRE(gs::matches_reference(op, R, b.data() + c.first, expected.data() + c.first, c.count));
          REQUIRE(mirror::test::same_bits(b.data(), orig.data(), c.first));
          REQUIRE(mirror::test::same_bits(b.data() + c.first + c.count, orig.data() + c.first + c.count,
                                          n - c.first - c.count));
        }
      }
    }
  }
}

TEST_CASE("conformance: reduce_scatter of a span has the bits of all_reduce, in place", CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  unsigned seed = 7;
  for (const int R : {2, 3, 4, 8}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    for (const std::size_t n : {std::size_t{13}, std::size_t{100003}}) {
      for (const auto op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::prod}) {
        CAPTURE(R, n, mirror::to_string(op));
        ++seed;
        std::vector<std::vector<float>> scattered(static_cast<std::size_t>(R)), reduced;
        for (int r = 0; r < R; ++r) scattered[static_cast<std::size_t>(r)] = gs::inexact_input<float>(op, r, n, seed);
        reduced = scattered;
        s.run([&](auto& ctx) {
          const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
          ctx.all_reduce(op, std::span<float>(reduced[r]));
          ctx.reduce_scatter(op, std::span<float>(scattered[r]));
        });
        for (int r = 0; r < R; ++r) {
          const auto c = gs::cut_for(n, R, r);
          REQUIRE(mirror::test::same_bits(scattered[static_cast<std::size_t>(r)].data() + c.first,
                                          reduced[static_cast<std::size_t>(r)].data() + c.first, c.count));
        }
      }
    }
  }
}

TEST_CASE("conformance: reduce_scatter of a nest cuts every leaf by its own length", CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 5, 8}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    const auto u = static_cast<std::size_t>(R);
    for (const auto op : {ReduceOp::sum, ReduceOp::min, ReduceOp::mean, ReduceOp::prod}) {
      CAPTURE(R, mirror::to_string(op));
      {  // a Hana struct of vectors and a span
        const std::size_t nw = 3 * u + 2, nd = 2 * u + 1, ns = u > 1 ? u - 1 : 0;
        std::vector<std::vector<double>> spans(u);
        for (int r = 0; r < R; ++r) spans[static_cast<std::size_t>(r)] = mirror::test::input_vector<double>(op, r + 1, nd);
        const auto spans_before = spans;
        const std::vector<float> ew = mirror::test::serial_reference<float>(op, R, nw);
        std::vector<double> ed(nd);
        std::vector<std::int32_t> es(ns);
        // the span's and the int leaf's references, as plain loops
        for (std::size_t i = 0; i < nd; ++i) {
          std::vector<double> xs;
          for (int r = 0; r < R; ++r) xs.push_back(mirror::test::input_value<double>(op, r + 1, i));
          double acc = xs[0];
          for (std::size_t j = 1; j < xs.size(); ++j) {
            acc = op == ReduceOp::min ? std::min(acc, xs[j]) : op == ReduceOp::prod ? acc * xs[j] : acc + xs[j];
          }
          ed[i] = op == ReduceOp::mean ? acc / R : acc;
        }
        for (std::size_t i = 0; i < ns; ++i) {
          std::int32_t acc = gs::small_int(0, i);
          for (int r = 1; r < R; ++r) {
            const std::int32_t x = gs::small_int(r, i);
            acc = op == ReduceOp::min ? std::min(acc, x) : op == ReduceOp::prod ? acc * x : acc + x;
          }
          es[i] = op == ReduceOp::mean ? acc / R : acc;
        }
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          gs::Grads g{mirror::test::input_vector<float>(op, r, nw), std::span<double>(spans[static_cast<std::size_t>(r)]),
                      std::vector<std::int32_t>(ns)};
          for (std::size_t i = 0; i < ns; ++i) g.steps[i] = gs::small_int(r, i);
          const gs::Grads out = ctx.reduce_scatter(op, g);
          const auto cw = gs::cut_for(nw, R, r), cd = gs::cut_for(nd, R, r), cs = gs::cut_for(ns, R, r);
          const bool ok = out.w.size() == cw.count && gs::matches_reference(op, R, out.w.data(), ew.data() + cw.first, cw.count) &&
                          out.d.data() == spans[static_cast<std::size_t>(r)].data() + cd.first && out.d.size() == cd.count &&
                          std::equal(out.d.begin(), out.d.end(), ed.begin() + static_cast<std::ptrdiff_t>(cd.first)) &&
                          out.steps.size() == cs.count &&
                          std::equal(out.steps.begin(), out.steps.end(), es.begin() + static_cast<std::ptrdiff_t>(cs.first));
          if (!ok) ++wrong;
        });
        REQUIRE(wrong == 0);
        for (int r = 0; r < R; ++r) {
          const auto cd = gs::cut_for(nd, R, r);
          const auto& b = spans[static_cast<std::size_t>(r)];
          const auto& a = spans_before[static_cast<std::size_t>(r)];
          REQUIRE(std::equal(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cd.first), a.begin()));
          REQUIRE(std::equal(b.begin() + static_cast<std::ptrdiff_t>(cd.first + cd.count), b.end(),
                             a.begin() + static_cast<std::ptrdiff_t>(cd.first + cd.count)));
        }
      }
      {  // a tuple of several element types, interleaved, has the bits of all_reduce of the same tuple
        // float leaves around a double and an int64 leaf: each element type is reduced as one
        // packed range, so a cut's position in that range (not only in its leaf) matters.
        using Nest = std::tuple<std::vector<float>, std::vector<double>, std::vector<float>, std::vector<std::int64_t>,
                                std::vector<float>>;
        const std::size_t n[] = {4 * u + 3, 1009, u > 1 ? u - 1 : 1, 2 * u + 1, 0};
        std::atomic<int> wrong{0};
        const unsigned seed = 40u + static_cast<unsigned>(R);
        s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          const Nest x{gs::inexact_input<float>(op, r, n[0], seed), gs::inexact_input<double>(op, r, n[1], seed),
                       gs::inexact_input<float>(op, r, n[2], seed + 1), gs::inexact_input<std::int64_t>(op, r, n[3], seed),
                       std::vector<float>{}};
          const auto whole = ctx.all_reduce(op, x);
          const Nest mine = ctx.reduce_scatter(op, x);
          bool ok = true;
          auto check = [&](const auto& got, const auto& all, std::size_t len) {
            const auto c = gs::cut_for(len, R, r);
            ok = ok && got.size() == c.count && mirror::test::same_bits(got.data(), all.data() + c.first, c.count);
          };
          check(std::get<0>(mine), std::get<0>(*whole), n[0]);
          check(std::get<1>(mine), std::get<1>(*whole), n[1]);
          check(std::get<2>(mine), std::get<2>(*whole), n[2]);
          check(std::get<3>(mine), std::get<3>(*whole), n[3]);
          check(std::get<4>(mine), std::get<4>(*whole), n[4]);
          if (!ok) ++wrong;
        });
        REQUIRE(wrong == 0);
      }
    }
  }
}

TEST_CASE("conformance: replicas that disagree on a reduce_scatter or all_gather get a shape_error everywhere, nothing written",
          CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {2, 3, 7}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    {  // a span one element longer on the last replica
      std::vector<std::vector<float>> buffers(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)].assign(r == R - 1 ? 10 : 9, float(r) + 0.5f);
      const auto before = buffers;
      const auto [raised, message] = gs::shape_errors(s, [&](auto& ctx) {
        ctx.reduce_scatter(ReduceOp::sum, std::span<float>(buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]));
      });
      REQUIRE(raised == R);
      REQUIRE_THAT(message, Catch::Contains("reduce_scatter"));
      REQUIRE(buffers == before);
    }
    {  // the second leaf of a nest differs on replica 1, the first (a span) agrees
      std::vector<std::vector<double>> buffers(static_cast<std::size_t>(R), std::vector<double>(12, 2.5));
      const auto before = buffers;
      const auto [raised, message] = gs::shape_errors(s, [&](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        ctx.reduce_scatter(ReduceOp::max, std::tuple{std::span<double>(buffers[static_cast<std::size_t>(r)]),
                                                     std::vector<int>(r == 1 ? 4 : 5, r)});
      });
      REQUIRE(raised == R);
      REQUIRE(!message.empty());
      REQUIRE(buffers == before);
    }
    {  // replicas that disagree on the op, or on the nest's type
      const auto [raised, message] = gs::shape_errors(s, [](auto& ctx) {
        ctx.reduce_scatter(ctx.replica_id_in_sync_group() == 0 ? ReduceOp::sum : ReduceOp::max, std::vector<int>(8, 1));
      });
      REQUIRE(raised == R);
      const auto [raised2, message2] = gs::shape_errors(s, [](auto& ctx) {
        if (ctx.replica_id_in_sync_group() == 1) {
          ctx.reduce_scatter(ReduceOp::sum, std::vector<double>(8, 1.0));
        } else {
          ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(8, 1.0f));
        }
      });
      REQUIRE(raised2 == R);
      REQUIRE_THAT(message2, Catch::Contains("mismatched nests"));
    }
    {  // all_gather: replicas that disagree on the nest's type
      const auto [raised, message] = gs::shape_errors(s, [](auto& ctx) {
        if (ctx.replica_id_in_sync_group() == 1) {
          ctx.all_gather(std::vector<double>(2, 1.0), mirror::axis0);
        } else {
          ctx.all_gather(std::vector<float>(3, 1.0f), mirror::axis0);
        }
      });
      REQUIRE(raised == R);
      REQUIRE_THAT(message, Catch::Contains("mismatched nests"));
    }
    // the strategy is still usable
    const auto ok = s.run([](auto& ctx) { return ctx.reduce_scatter(ReduceOp::sum, std::vector<int>(1, 2)); });
    REQUIRE(ok[0] == std::vector<int>{2 * R});
    for (std::size_t r = 1; r < ok.size(); ++r) REQUIRE(ok[r].empty());
  }
}

// ------------------------------------------------------------------------------------------------
// all_gather
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("conformance: all_gather concatenates vectors of different lengths in replica order",
                   CONFORMANCE_TAG, float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    const std::vector<T> expected = gs::concatenation<T>(R, 0);  // replica 0 gives 0 elements
    std::atomic<int> wrong{0};
    const auto out = s.run([&](auto& ctx) {
      const auto mine = gs::gather_piece<T>(ctx.replica_id_in_sync_group(), 0);
      const mirror::Synced<std::vector<T>> all = ctx.all_gather(mine, mirror::axis0);
      if (*all != expected) ++wrong;
      return all;
    });
    REQUIRE(wrong == 0);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(out)>, mirror::Mirrored<std::vector<T>>>);
    for (const auto& v : out) REQUIRE(v == expected);
    {  // every replica empty
      const auto none = s.run([](auto& ctx) { return ctx.all_gather(std::vector<T>{}, mirror::axis0); });
      for (const auto& v : none) REQUIRE(v.empty());
    }
    {  // long leaves: 1009 + r and large_size / 8 + r elements
      for (const std::size_t base : {std::size_t{1009}, mirror::test::large_size / 8}) {
        CAPTURE(base);
        std::vector<T> want;
        for (int r = 0; r < R; ++r) {
          const std::vector<T> v = mirror::test::input_vector<T>(ReduceOp::sum, r, base + static_cast<std::size_t>(r));
          want.insert(want.end(), v.begin(), v.end());
        }
        std::atomic<int> bad{0};
        s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          const auto all = ctx.all_gather(mirror::test::input_vector<T>(ReduceOp::sum, r, base + static_cast<std::size_t>(r)),
                                          mirror::axis0);
          if (*all != want) ++bad;
        });
        REQUIRE(bad == 0);
      }
    }
  }
}

TEST_CASE("conformance: all_gather of scalars and std::arrays gives vectors", CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    std::vector<float> scalars;
    std::vector<double> arrays;
    for (int r = 0; r < R; ++r) {
      scalars.push_back(float(r) * 1.5f - 2.0f);
      for (int j = 0; j < 3; ++j) arrays.push_back(double(r) * 10.0 + j + 0.25);
    }
    std::atomic<int> wrong{0};
    s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const auto one = ctx.all_gather(float(r) * 1.5f - 2.0f, mirror::axis0);
      static_assert(std::is_same_v<decltype(one), const mirror::Synced<std::vector<float>>>);
      const auto three = ctx.all_gather(std::array<double, 3>{r * 10.0 + 0.25, r * 10.0 + 1.25, r * 10.0 + 2.25}, mirror::axis0);
      static_assert(std::is_same_v<decltype(three), const mirror::Synced<std::vector<double>>>);
      if (*one != scalars || *three != arrays) ++wrong;
    });
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("conformance: all_gather of matrices concatenates rows; different columns are a shape_error",
          CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    // replica r: r % 3 rows of 4 columns (replica 0 none, but still 4 columns)
    auto rows_of = [](int r) {
      mirror::matrix<double> m{std::vector<double>(static_cast<std::size_t>(r % 3) * 4), 4};
      for (std::size_t i = 0; i < m.data.size(); ++i) m.data[i] = r * 100.0 + double(i) + 0.5;
      return m;
    };
    mirror::matrix<double> want{{}, 4};
    for (int r = 0; r < R; ++r) {
      const auto m = rows_of(r);
      want.data.insert(want.data.end(), m.data.begin(), m.data.end());
    }
    const auto out = s.run([&](auto& ctx) { return ctx.all_gather(rows_of(ctx.replica_id_in_sync_group()), mirror::axis0); });
    for (const mirror::matrix<double>& m : out) {
      REQUIRE(m.cols == 4);
      REQUIRE(m.data == want.data);
    }
    if (R > 1) {
      {  // columns differ on the last replica
        const auto [raised, message] = gs::shape_errors(s, [&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          mirror::matrix<float> m{std::vector<float>(r == R - 1 ? 6 : 4, 1.0f), static_cast<std::size_t>(r == R - 1 ? 3 : 2)};
          ctx.all_gather(m, mirror::axis0);
        });
        REQUIRE(raised == R);
        REQUIRE_THAT(message, Catch::Contains("rows of 3 elements on replica " + std::to_string(R - 1)) &&
                                  Catch::Contains("of 2 on replica 0"));
      }
    }
  }
}

TEST_CASE("conformance: all_gather of a nest of several element types and leaf kinds", CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 5}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    using Nest = std::tuple<float, std::vector<std::int64_t>, std::array<double, 2>, std::vector<std::int32_t>,
                            std::vector<float>>;
    using Gathered = std::tuple<std::vector<float>, std::vector<std::int64_t>, std::vector<double>,
                                std::vector<std::int32_t>, std::vector<float>>;
    auto make = [](int r) {
      return Nest{float(r) + 0.5f, gs::gather_piece<std::int64_t>(r, 1), {double(r), -double(r) - 0.5},
                  gs::gather_piece<std::int32_t>(r, 0), gs::gather_piece<float>(r, 2)};
    };
    Gathered want;
    for (int r = 0; r < R; ++r) {
      const Nest x = make(r);
      std::get<0>(want).push_back(std::get<0>(x));
      std::get<1>(want).insert(std::get<1>(want).end(), std::get<1>(x).begin(), std::get<1>(x).end());
      std::get<2>(want).insert(std::get<2>(want).end(), std::get<2>(x).begin(), std::get<2>(x).end());
      std::get<3>(want).insert(std::get<3>(want).end(), std::get<3>(x).begin(), std::get<3>(x).end());
      std::get<4>(want).insert(std::get<4>(want).end(), std::get<4>(x).begin(), std::get<4>(x).end());
    }
    const auto out = s.run([&](auto& ctx) { return ctx.all_gather(make(ctx.replica_id_in_sync_group()), mirror::axis0); });
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(out)>, mirror::Mirrored<Gathered>>);
    for (const Gathered& g : out) REQUIRE(g == want);

    {  // a Hana struct whose leaves all grow keeps its type
      auto owned = [](int r) {
        gs::Owned o;
        o.w = gs::gather_piece<float>(r, 3);
        o.m = mirror::matrix<double>{std::vector<double>(static_cast<std::size_t>(r + 1) * 2, r + 0.75), 2};
        o.ids = gs::gather_piece<std::int64_t>(r, 4);
        return o;
      };
      gs::Owned w;
      w.m.cols = 2;
      for (int r = 0; r < R; ++r) {
        const gs::Owned o = owned(r);
        w.w.insert(w.w.end(), o.w.begin(), o.w.end());
        w.m.data.insert(w.m.data.end(), o.m.data.begin(), o.m.data.end());
        w.ids.insert(w.ids.end(), o.ids.begin(), o.ids.end());
      }
      const auto got = s.run([&](auto& ctx) { return ctx.all_gather(owned(ctx.replica_id_in_sync_group()), mirror::axis0); });
      for (const gs::Owned& g : got) {
        REQUIRE(g.w == w.w);
        REQUIRE(g.m == w.m);
        REQUIRE(g.ids == w.ids);
      }
    }
  }
}

TEMPLATE_TEST_CASE("conformance: all_gather into an out span", CONFORMANCE_TAG, float, std::int64_t) {
  using T = TestType;
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    const std::vector<T> expected = gs::concatenation<T>(R, 1);
    std::vector<std::vector<T>> ins(static_cast<std::size_t>(R)), outs(static_cast<std::size_t>(R), std::vector<T>(expected.size(), T(-7)));
    for (int r = 0; r < R; ++r) ins[static_cast<std::size_t>(r)] = gs::gather_piece<T>(r, 1);
    const auto ins_before = ins;
    s.run([&](auto& ctx) {
      const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
      ctx.all_gather(std::span<const T>(ins[r]), std::span<T>(outs[r]), mirror::axis0);
    });
    for (const auto& o : outs) REQUIRE(o == expected);
    REQUIRE(ins == ins_before);

    {  // every replica reads one shared const input (TF's testAllGatherNest1D0Axis pattern)
      static const T shared[] = {T(1), T(2), T(3)};  // read-only storage: gathering must not write it
      std::vector<std::vector<T>> o(static_cast<std::size_t>(R), std::vector<T>(3 * static_cast<std::size_t>(R)));
      s.run([&](auto& ctx) {
        ctx.all_gather(std::span<const T>(shared), std::span<T>(o[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]),
                       mirror::axis0);
      });
      std::vector<T> want;
      for (int r = 0; r < R; ++r) want.insert(want.end(), std::begin(shared), std::end(shared));
      for (const auto& v : o) REQUIRE(v == want);
    }
    {  // an out span of the wrong size on one replica is a shape_error naming it, nothing written
      const int wrong_one = R - 1;
      std::vector<std::vector<T>> o(static_cast<std::size_t>(R), std::vector<T>(expected.size(), T(-7)));
      o[static_cast<std::size_t>(wrong_one)].push_back(T(-7));
      const auto before = o;
      const auto [raised, message] = gs::shape_errors(s, [&](auto& ctx) {
        const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
        ctx.all_gather(std::span<const T>(ins[r]), std::span<T>(o[r]), mirror::axis0);
      });
      REQUIRE(raised == R);
      REQUIRE_THAT(message, Catch::Contains("on replica " + std::to_string(wrong_one)) &&
                                Catch::Contains("out has " + std::to_string(expected.size() + 1) + " elements") &&
                                Catch::Contains(std::to_string(expected.size()) + " in all"));
      REQUIRE(o == before);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// strategy.gather and distribute_values_from_function
// ------------------------------------------------------------------------------------------------

TEST_CASE("conformance: strategy.gather equals a serial concatenation of the components", CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    using Nest = std::tuple<std::vector<double>, float, mirror::matrix<std::int32_t>>;
    auto make = [](int r) {
      return Nest{gs::gather_piece<double>(r, 0), float(r) - 0.5f,
                  mirror::matrix<std::int32_t>{std::vector<std::int32_t>(static_cast<std::size_t>(r % 2) * 3, r), 3}};
    };
    // (run would split a returned tuple into a tuple of PerReplica)
    const mirror::PerReplica<Nest> per_replica =
        s.distribute_values_from_function([&](const mirror::ValueContext& c) { return make(c.replica_id_in_sync_group); });
    std::tuple<std::vector<double>, std::vector<float>, mirror::matrix<std::int32_t>> want{{}, {}, {{}, 3}};
    for (int r = 0; r < R; ++r) {
      const Nest x = make(r);
      std::get<0>(want).insert(std::get<0>(want).end(), std::get<0>(x).begin(), std::get<0>(x).end());
      std::get<1>(want).push_back(std::get<1>(x));
      std::get<2>(want).data.insert(std::get<2>(want).data.end(), std::get<2>(x).data.begin(), std::get<2>(x).data.end());
    }
    const auto got = s.gather(per_replica, mirror::axis0);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(got)>, decltype(want)>);
    REQUIRE(got == want);

    {  // a Mirrored value: every replica's copy, R times
      const mirror::Mirrored<std::vector<float>> m =
          s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, std::vector<float>{1.0f, 0.25f}); });
      std::vector<float> w;
      for (int r = 0; r < R; ++r) w.insert(w.end(), {float(R), 0.25f * float(R)});
      REQUIRE(s.gather(m, mirror::axis0) == w);
    }
    {  // the result of all_gather inside fn is the same
      const auto inside = s.run([&](auto& ctx) { return ctx.all_gather(make(ctx.replica_id_in_sync_group()), mirror::axis0); });
      for (const auto& v : inside) REQUIRE(v == got);
    }
    {  // a value with another number of components than replicas
      const mirror::PerReplica<std::vector<float>> extra(std::vector<std::vector<float>>(static_cast<std::size_t>(R + 1)));
      REQUIRE_THROWS_MATCHES(s.gather(extra, mirror::axis0), mirror::shape_error,
                             mirror::test::what(Catch::Contains(std::to_string(R + 1) + " components")));
    }
    if (R > 1) {
      {  // matrices of different columns are a shape_error
        const auto bad = s.run([](auto& ctx) {
          const auto c = static_cast<std::size_t>(1 + ctx.replica_id_in_sync_group());
          return mirror::matrix<float>{std::vector<float>(c, 1.0f), c};
        });
        REQUIRE_THROWS_MATCHES(s.gather(bad, mirror::axis0), mirror::shape_error,
                               mirror::test::what(Catch::Contains("rows of 2 elements on replica 1")));
      }
    }
  }
}

TEST_CASE("conformance: distribute_values_from_function calls fn once per replica, in order", CONFORMANCE_TAG) {
  namespace gs = gather_scatter;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = gs::strategy_with(R);
    CAPTURE(R);
    std::vector<mirror::ValueContext> calls;
    const mirror::PerReplica<std::vector<int>> v = s.distribute_values_from_function([&](const mirror::ValueContext& c) {
      calls.push_back(c);
      return std::vector<int>(static_cast<std::size_t>(c.replica_id_in_sync_group + 1), c.replica_id_in_sync_group);
    });
    REQUIRE(calls.size() == static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      REQUIRE(calls[static_cast<std::size_t>(r)] == mirror::ValueContext{r, R});
      REQUIRE(v[static_cast<std::size_t>(r)] == std::vector<int>(static_cast<std::size_t>(r + 1), r));
    }
    // each replica receives its own component in run
    const auto seen = s.run([](auto& ctx, const std::vector<int>& mine) {
      return mine == std::vector<int>(static_cast<std::size_t>(ctx.replica_id_in_sync_group() + 1), ctx.replica_id_in_sync_group());
    }, v);
    for (const bool ok : seen) REQUIRE(ok);
  }
}
