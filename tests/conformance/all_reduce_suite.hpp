// SPDX-License-Identifier: Apache-2.0
// The laws every (device, ops) pair must satisfy, written once. A test file defines
//   CONFORMANCE_DEVICE  the device policy type
//   CONFORMANCE_OPS     an ops policy value, e.g. mirror::ops::HierarchicalCopy{.num_packs = 3}
//   CONFORMANCE_TAG     the Catch2 tags, e.g. "[threads][hierarchical_copy]"
// and optionally
//   CONFORMANCE_SUPPORTS(R)  false for replica counts the pair cannot run here (NCCL needs a
//                            GPU per replica); those counts are skipped
//   CONFORMANCE_MEAN_IS_PREMUL_SUM  1 for a pair whose floating-point mean is NCCL's ncclAvg:
//                            NCCL computes it as sum_r (x_r * (1/R)) (a "pre-multiplied sum"), so
//                            with R not a power of two its last bits may differ from the serial
//                            (x_0 + ... + x_{R-1}) / R. Those means are checked against that
//                            formula's rounding bound; everything else stays bitwise.
// and includes this file.

#include <boost/hana/define_struct.hpp>
#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <array>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/reference.hpp"

#include "conformance/suite_strategy.hpp"

namespace conformance {

using mirror::ReduceOp;

/// Whether `op` on R replicas may round differently from the serial reference for this pair:
/// only a pre-multiplied floating-point mean, and only when 1/R is inexact (R not a power of 2).
template <class T>
bool mean_may_round(ReduceOp op, int R) {
  return CONFORMANCE_MEAN_IS_PREMUL_SUM != 0 && op == ReduceOp::mean && std::is_floating_point_v<T> &&
         (R & (R - 1)) != 0;
}

/// |got - want| within the rounding of sum_r fl(x_r * fl(1/R)) for inputs |x_r| <= scale: each
/// product is off by about 2u|x_r|/R (u = eps/2), each of the R-1 additions by u * scale, so
/// (R + 1) * eps * scale bounds it; the serial reference itself rounds once, below that.
template <class T>
bool within_premul_sum_rounding(T got, T want, int R, double scale) {
  const double tol = double(R + 1) * double(std::numeric_limits<T>::epsilon()) * std::max(scale, 1.0);
  return std::abs(double(got) - double(want)) <= tol;
}

/// The suite's comparison: bitwise, except where mean_may_round allows the pre-multiplied sum.
template <class T>
bool matches(ReduceOp op, int R, const T* got, const T* want, std::size_t n, double scale) {
  if (!mean_may_round<T>(op, R)) return mirror::test::same_bits(got, want, n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!within_premul_sum_rounding(got[i], want[i], R, scale)) return false;
  }
  return true;
}

/// The largest |input| of the reference inputs for op on R replicas (one period covers all).
template <class T>
double input_scale(ReduceOp op, int R) {
  double m = 0;
  for (int r = 0; r < R; ++r) {
    for (std::size_t i = 0; i < mirror::test::input_period; ++i) {
      m = std::max(m, std::abs(double(mirror::test::input_value<T>(op, r, i))));
    }
  }
  return m;
}

struct Mixed {
  BOOST_HANA_DEFINE_STRUCT(Mixed, (std::vector<float>, w), (float, b), (std::array<double, 3>, d),
                           (std::tuple<int, std::vector<int>>, t), (std::int64_t, steps));
};

/// Replica r's Mixed: every kind of leaf, values that depend on r.
inline Mixed make_mixed(int r) {
  return Mixed{std::vector<float>{float(r), float(2 * r), -1.0f, float(r * r)},
               float(10 + r),
               {double(r), -double(r), 0.5},
               {r * 3, std::vector<int>(5, r - 1)},
               std::int64_t{100} * r};
}

}  // namespace conformance

using mirror::ReduceOp;

TEMPLATE_TEST_CASE("conformance: all_reduce equals a serial reference for every op, replica count and size",
                   CONFORMANCE_TAG, float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  for (const int R : mirror::test::replica_counts) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    // 1 and 2: the scalar latency path up to its 8-byte bound (2 floats), 3: the one-line path
    const std::size_t sizes[] = {1, 2, 3, static_cast<std::size_t>(5 * R + 1), 1009, mirror::test::large_size};
    for (const std::size_t n : sizes) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        const std::vector<T> expected = mirror::test::serial_reference<T>(op, R, n);
        const double scale = conformance::input_scale<T>(op, R);
        std::vector<std::vector<T>> inputs(static_cast<std::size_t>(R));
        for (int r = 0; r < R; ++r) inputs[static_cast<std::size_t>(r)] = mirror::test::input_vector<T>(op, r, n);
        const auto pristine = inputs;
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const auto out = ctx.all_reduce(op, inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
          if (out->size() != n || !conformance::matches(op, R, out->data(), expected.data(), n, scale)) ++wrong;
        });
        REQUIRE(inputs == pristine);  // owning leaves are reduced in a copy
        REQUIRE(wrong == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("conformance: span leaves are reduced in place in every replica's buffer", CONFORMANCE_TAG, float,
                   double, std::int32_t, std::int64_t) {
  using T = TestType;
  for (const int R : {1, 2, 3, 7, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{4099}}) {
      for (const auto op : {ReduceOp::sum, ReduceOp::max, ReduceOp::mean}) {
        CAPTURE(R, n, mirror::to_string(op));
        const std::vector<T> expected = mirror::test::serial_reference<T>(op, R, n);
        std::vector<std::vector<T>> buffers(static_cast<std::size_t>(R));
        for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)] = mirror::test::input_vector<T>(op, r, n);
        std::atomic<int> aliased{0};
        s.run([&](auto& ctx) {
          auto& mine = buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
          const auto out = ctx.all_reduce(op, std::span<T>(mine));
          if (out->data() == mine.data() && out->size() == n) ++aliased;
        });
        REQUIRE(aliased == R);
        const double scale = conformance::input_scale<T>(op, R);
        for (const auto& b : buffers) REQUIRE(conformance::matches(op, R, b.data(), expected.data(), n, scale));
      }
    }
  }
}

TEST_CASE("conformance: a nest of several element types and leaf kinds is reduced leaf by leaf", CONFORMANCE_TAG) {
  for (const int R : {1, 2, 3, 5}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const auto op : {ReduceOp::sum, ReduceOp::min, ReduceOp::mean}) {
      CAPTURE(R, mirror::to_string(op));
      const auto make = conformance::make_mixed;
      const auto per_replica = s.run([&](auto& ctx) {
        return std::pair{make(ctx.replica_id_in_sync_group()),
                         ctx.all_reduce(op, make(ctx.replica_id_in_sync_group()))};
      });
      const mirror::PerReplica<conformance::Mixed>& inputs = per_replica.first;
      const mirror::Mirrored<conformance::Mixed>& outputs = per_replica.second;
      const conformance::Mixed reduced = s.reduce(op, inputs);  // the host path, as a second reference
      // An independent reference for one leaf of each kind:
      float b = make(0).b;
      int t0 = std::get<0>(make(0).t);
      for (int r = 1; r < R; ++r) {
        const auto x = make(r);
        b = op == ReduceOp::min ? std::min(b, x.b) : b + x.b;
        t0 = op == ReduceOp::min ? std::min(t0, std::get<0>(x.t)) : t0 + std::get<0>(x.t);
      }
      if (op == ReduceOp::mean) {
        b /= float(R);
        t0 /= R;
      }
      // Floating leaves: bitwise, or within the pre-multiplied sum's rounding (inputs <= 10 + R^2).
      const double scale = 10.0 + double(R * R);
      for (const auto& o : outputs) {
        REQUIRE(conformance::matches(op, R, &o.b, &b, 1, scale));
        REQUIRE(std::get<0>(o.t) == t0);
        REQUIRE(conformance::matches(op, R, o.w.data(), reduced.w.data(), o.w.size(), scale));
        REQUIRE(conformance::matches(op, R, o.d.data(), reduced.d.data(), o.d.size(), scale));
        REQUIRE(std::get<1>(o.t) == std::get<1>(reduced.t));
        REQUIRE(o.steps == reduced.steps);
        REQUIRE(conformance::matches(op, R, &o.b, &reduced.b, 1, scale));
      }
    }
  }
}

TEST_CASE("conformance: results are bitwise reproducible and identical on every replica", CONFORMANCE_TAG) {
  for (const int R : {2, 3, 8}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const std::size_t n : {std::size_t{7}, std::size_t{100003}}) {
      CAPTURE(R, n);
      auto once = [&] {
        return s.run([&](auto& ctx) {
          std::mt19937 gen(static_cast<unsigned>(1234 + ctx.replica_id_in_sync_group()));
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          std::vector<float> x(n);
          for (auto& v : x) v = dist(gen);
          return ctx.all_reduce(ReduceOp::sum, x);
        });
      };
      const auto first = once();
      for (const auto& copy : first) REQUIRE(mirror::test::same_bits(copy.data(), first.primary().data(), n));
      for (int again = 0; again < 3; ++again) {
        const auto next = once();
        for (const auto& copy : next) REQUIRE(mirror::test::same_bits(copy.data(), first.primary().data(), n));
      }
    }
  }
}

TEST_CASE("conformance: broadcast gives every replica the source's value", CONFORMANCE_TAG) {
  for (const int R : {1, 2, 3, 7}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (int from = 0; from < R; ++from) {
      CAPTURE(R, from);
      std::vector<std::vector<double>> views(static_cast<std::size_t>(R), std::vector<double>(33));
      const auto out = s.run([&](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        auto& view = views[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < view.size(); ++i) view[i] = r * 1000.0 + double(i);
        // vectors of different sizes: they take the source's size
        std::tuple<std::vector<int>, std::array<float, 2>, std::span<double>> v{
            std::vector<int>(static_cast<std::size_t>(r + 1), r), {float(r), -float(r)}, std::span<double>(view)};
        return ctx.broadcast(v, from);
      });
      for (const auto& copy : out) {
        REQUIRE(std::get<0>(copy) == std::vector<int>(static_cast<std::size_t>(from + 1), from));
        REQUIRE(std::get<1>(copy) == std::array<float, 2>{float(from), -float(from)});
      }
      for (const auto& view : views) {
        for (std::size_t i = 0; i < view.size(); ++i) REQUIRE(view[i] == from * 1000.0 + double(i));
      }
    }
  }
}

TEST_CASE("conformance: a broadcast of a few bytes (none resizable) gives every replica the source's value",
          CONFORMANCE_TAG) {
  // Up to Strategy::small_broadcast_bytes (64) the bytes ride in the call's one exchange; from
  // 65 on they take the general path. The span's length walks across that line: 4 + 8 + 1 + 8k
  // bytes in all, k = 0 (an empty span), 1, 6 (61 bytes), 7 (69) and 16.
  for (const int R : {1, 2, 3, 7}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const std::size_t k : {0, 1, 6, 7, 16}) {
      for (int from = 0; from < R; ++from) {
        CAPTURE(R, k, from);
        std::vector<std::vector<double>> views(static_cast<std::size_t>(R), std::vector<double>(k));
        const auto out = s.run([&](auto& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          auto& view = views[static_cast<std::size_t>(r)];
          for (std::size_t i = 0; i < view.size(); ++i) view[i] = r * 1000.0 + double(i) + 0.25;
          std::tuple<int, std::array<float, 2>, bool, std::span<double>> v{
              r * 7 - 3, {float(r) + 0.5f, -float(r)}, r % 2 == 1, std::span<double>(view)};
          return ctx.broadcast(v, from);
        });
        for (const auto& copy : out) {
          REQUIRE(std::get<0>(copy) == from * 7 - 3);
          REQUIRE(std::get<1>(copy) == std::array<float, 2>{float(from) + 0.5f, -float(from)});
          REQUIRE(std::get<2>(copy) == (from % 2 == 1));
        }
        for (const auto& view : views) {
          for (std::size_t i = 0; i < view.size(); ++i) REQUIRE(view[i] == from * 1000.0 + double(i) + 0.25);
        }
      }
    }
  }
}

TEST_CASE("conformance: many small broadcasts between other collectives each deliver their own value",
          CONFORMANCE_TAG) {
  // A replica reads the source's bytes after the exchange; the source is meanwhile in the next
  // collective. A broadcast from each replica in turn, an all_reduce and a broadcast of a
  // double, 300 times: a value read from the wrong call would show.
  for (const int R : {2, 3, 7}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    CAPTURE(R);
    const auto out = s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      int bad = 0;
      for (int step = 0; step < 300; ++step) {
        const int from = step % R;
        if (*ctx.broadcast(r * 100'000 + step, from) != from * 100'000 + step) ++bad;
        if (*ctx.all_reduce(ReduceOp::sum, 1) != R) ++bad;
        if (*ctx.broadcast(double(step) + 0.5 * r, R - 1 - from) != double(step) + 0.5 * (R - 1 - from)) ++bad;
      }
      return bad;
    });
    for (const int bad : out) REQUIRE(bad == 0);
  }
}

TEST_CASE("conformance: a small broadcast whose replicas disagree on a size is a shape_error everywhere",
          CONFORMANCE_TAG) {
  // Spans of 16 and 17 floats: 64 bytes (the exchange's path) against 68 (the general one), and
  // 3 against 4 (both small). Every replica throws and no span changes.
  for (const int R : {2, 3}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const std::size_t n : {std::size_t{16}, std::size_t{3}}) {
      CAPTURE(R, n);
      std::vector<std::vector<float>> buffers(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)].assign(r == R - 1 ? n + 1 : n, float(r));
      const auto before = buffers;
      std::atomic<int> raised{0};
      try {
        s.run([&](auto& ctx) {
          try {
            ctx.broadcast(std::span<float>(buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]));
          } catch (const mirror::shape_error&) {
            ++raised;
            throw;
          }
        });
        FAIL("no shape_error");
      } catch (const mirror::shape_error& e) {
        REQUIRE_THAT(e.what(), Catch::Contains(std::to_string(n + 1) + " elements on replica " + std::to_string(R - 1)));
      }
      REQUIRE(raised == R);
      REQUIRE(buffers == before);
    }
    // the strategy is still usable
    const auto ok = s.run([](auto& ctx) { return ctx.broadcast(ctx.replica_id_in_sync_group() + 1, 1); });
    for (const int v : ok) REQUIRE(v == 2);
  }
}

TEST_CASE("conformance: replicas that disagree get a shape_error on every replica and nothing changes",
          CONFORMANCE_TAG) {
  for (const int R : {2, 3, 7}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    CAPTURE(R);
    SECTION("different sizes of an in-place leaf") {
      std::vector<std::vector<float>> buffers(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)].assign(r == R - 1 ? 9 : 8, float(r));
      const auto before = buffers;
      std::atomic<int> raised{0};
      try {
        s.run([&](auto& ctx) {
          try {
            ctx.all_reduce(ReduceOp::sum, std::span<float>(buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]));
          } catch (const mirror::shape_error&) {
            ++raised;
            throw;
          }
        });
        FAIL("no shape_error");
      } catch (const mirror::shape_error& e) {
        REQUIRE_THAT(e.what(), Catch::Contains("9 elements on replica " + std::to_string(R - 1)) &&
                                   Catch::Contains("8 on replica 0"));
      }
      REQUIRE(raised == R);
      REQUIRE(buffers == before);
    }
    SECTION("different nest types") {
      REQUIRE_THROWS_MATCHES(s.run([](auto& ctx) {
        if (ctx.replica_id_in_sync_group() == 1) {
          ctx.all_reduce(ReduceOp::sum, 1.0);
        } else {
          ctx.all_reduce(ReduceOp::sum, 1.0f);
        }
      }), mirror::shape_error, mirror::test::what(Catch::Contains("mismatched nests")));
    }
    SECTION("different ops") {
      REQUIRE_THROWS_AS(s.run([](auto& ctx) {
        ctx.all_reduce(ctx.replica_id_in_sync_group() == 0 ? ReduceOp::sum : ReduceOp::max, 1);
      }),
                        mirror::shape_error);
    }
    // the strategy is still usable
    const auto ok = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 2); });
    REQUIRE(ok.primary() == 2 * R);
  }
}

TEST_CASE("conformance: an exception in one replica cancels the others' collectives", CONFORMANCE_TAG) {
  for (const int R : {2, 4, 16}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    CAPTURE(R);
    for (int thrower = 0; thrower < R; thrower += R - 1) {
      try {
        s.run([&](auto& ctx) {
          std::vector<float> x(1000, 1.0f);
          ctx.all_reduce(ReduceOp::sum, x);
          if (ctx.replica_id_in_sync_group() == thrower) throw std::logic_error("replica failed");
          ctx.all_reduce(ReduceOp::sum, x);  // the others wait here until cancelled
          ctx.all_reduce(ReduceOp::sum, x);
        });
        FAIL("no exception");
      } catch (const mirror::replica_error& e) {
        REQUIRE(e.replica() == thrower);
        REQUIRE_THROWS_MATCHES(e.rethrow_nested(), std::logic_error, mirror::test::what("replica failed"));
      }
      const auto ok = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::max, ctx.replica_id_in_sync_group()); });
      REQUIRE(ok.primary() == R - 1);
    }
  }
}

TEST_CASE("conformance: the non-blocking forms give the blocking forms' bits, several outstanding at once",
          CONFORMANCE_TAG) {
  for (const int R : {1, 2, 3, 5}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const auto op : {ReduceOp::sum, ReduceOp::max, ReduceOp::mean}) {
      CAPTURE(R, mirror::to_string(op));
      const std::size_t n = 4099;
      std::vector<std::vector<float>> spans_async(static_cast<std::size_t>(R)), spans_blocking(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r) {
        spans_async[static_cast<std::size_t>(r)] = mirror::test::input_vector<float>(op, r, n);
        spans_blocking[static_cast<std::size_t>(r)] = spans_async[static_cast<std::size_t>(r)];
      }
      const auto make = conformance::make_mixed;
      std::atomic<int> wrong{0};
      s.run([&](auto& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        auto& a = spans_async[static_cast<std::size_t>(g)];
        const std::vector<double> v = mirror::test::input_vector<double>(op, g, 1009);
        // Three outstanding, waited for in another order than started.
        auto p1 = ctx.all_reduce_async(op, std::span<float>(a));
        auto p2 = ctx.all_reduce_async(op, make(g));
        auto p3 = ctx.all_reduce_async(op, v);
        const auto r3 = p3.wait();
        const auto r2 = p2.wait();
        const auto r1 = p1.wait();
        if (!p1.ready() || r1->data() != a.data()) ++wrong;
        (void)ctx.all_reduce(op, std::span<float>(spans_blocking[static_cast<std::size_t>(g)]));
        const auto b2 = ctx.all_reduce(op, make(g));
        const auto b3 = ctx.all_reduce(op, v);
        if (!mirror::test::same_bits(r3->data(), b3->data(), b3->size())) ++wrong;
        if (!mirror::test::same_bits(&r2->b, &b2->b, 1) || r2->w != b2->w || r2->t != b2->t || r2->steps != b2->steps ||
            !mirror::test::same_bits(r2->d.data(), b2->d.data(), 3)) {
          ++wrong;
        }
        // The other three forms, started together and waited for in order.
        std::vector<float> cut_in = mirror::test::input_vector<float>(op, g, 37);
        auto rs = ctx.reduce_scatter_async(op, cut_in);
        auto ag = ctx.all_gather_async(std::vector<int>(static_cast<std::size_t>(g + 1), g), mirror::axis0);
        auto bc = ctx.broadcast_async(std::vector<double>(3, double(g)), R - 1);
        const auto cut = rs.wait();
        const auto gathered = ag.wait();
        const auto broadcast = bc.wait();
        if (cut != ctx.reduce_scatter(op, cut_in)) ++wrong;
        if (*gathered != *ctx.all_gather(std::vector<int>(static_cast<std::size_t>(g + 1), g), mirror::axis0)) ++wrong;
        if (*broadcast != std::vector<double>(3, double(R - 1))) ++wrong;
      });
      REQUIRE(wrong == 0);
      for (int r = 0; r < R; ++r) {
        REQUIRE(mirror::test::same_bits(spans_async[static_cast<std::size_t>(r)].data(),
                                        spans_blocking[static_cast<std::size_t>(r)].data(), n));
      }
    }
  }
}

TEST_CASE("conformance: gradient buckets give each bucket's all-reduce bits, any ready order", CONFORMANCE_TAG) {
  using Grads = std::tuple<std::vector<float>, std::span<float>, std::vector<double>, std::vector<float>,
                           std::vector<float>>;
  for (const int R : {1, 2, 3}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const std::size_t cap : {std::size_t{0}, std::size_t{64}, std::size_t{4096}, std::size_t{1} << 30}) {
      for (const auto op : {ReduceOp::sum, ReduceOp::mean}) {
        CAPTURE(R, cap, mirror::to_string(op));
        std::vector<std::vector<float>> span_memory(static_cast<std::size_t>(R));
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const int g = ctx.replica_id_in_sync_group();
          auto& mem = span_memory[static_cast<std::size_t>(g)];
          mem = mirror::test::input_vector<float>(op, g + 1, 300);
          Grads grads{mirror::test::input_vector<float>(op, g, 10), std::span<float>(mem),
                      mirror::test::input_vector<double>(op, g, 7), mirror::test::input_vector<float>(op, g + 2, 33),
                      std::vector<float>{}};
          Grads before = grads;
          std::vector<float> span_copy = mem;
          std::get<1>(before) = std::span<float>(span_copy);
          auto buckets = ctx.gradient_buckets(op, grads, cap);
          for (const std::size_t i : {std::size_t{4}, std::size_t{1}, std::size_t{3}, std::size_t{0}, std::size_t{2}}) {
            buckets.ready(i);
          }
          buckets.finish();
          // Reference: the blocking all-reduce of each leaf (a bucket packs several leaves into
          // one buffer, which changes no element's bits).
          const auto w0 = ctx.all_reduce(op, std::get<0>(before));
          const auto w1 = ctx.all_reduce(op, std::get<1>(before));
          const auto w2 = ctx.all_reduce(op, std::get<2>(before));
          const auto w3 = ctx.all_reduce(op, std::get<3>(before));
          if (!mirror::test::same_bits(std::get<0>(grads).data(), w0->data(), 10) ||
              !mirror::test::same_bits(mem.data(), span_copy.data(), 300) ||
              !mirror::test::same_bits(std::get<2>(grads).data(), w2->data(), 7) ||
              !mirror::test::same_bits(std::get<3>(grads).data(), w3->data(), 33)) {
            ++wrong;
          }
          (void)w1;
        });
        REQUIRE(wrong == 0);
      }
    }
  }
}

TEST_CASE("conformance: sharded gradient buckets leave each replica its reduce_scatter cut of every leaf",
          CONFORMANCE_TAG) {
  // Lengths that are not multiples of R (and one shorter than R) exercise the batch-split cuts
  // and the zero padding of a packed bucket; the double leaf makes a bucket of its own type.
  using Grads = std::tuple<std::vector<float>, std::span<float>, std::vector<double>, std::vector<float>,
                           std::vector<float>, std::vector<float>>;
  constexpr std::array<std::size_t, 6> lengths{10, 301, 7, 33, 0, 2};
  for (const int R : {1, 2, 3}) {
    if (!(CONFORMANCE_SUPPORTS(R))) continue;
    auto& s = conformance::strategy_with(R);
    for (const std::size_t cap : {std::size_t{0}, std::size_t{64}, std::size_t{4096}, std::size_t{1} << 30}) {
      for (const auto op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
        CAPTURE(R, cap, mirror::to_string(op));
        std::vector<std::vector<float>> span_memory(static_cast<std::size_t>(R));
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const int g = ctx.replica_id_in_sync_group();
          auto& mem = span_memory[static_cast<std::size_t>(g)];
          mem = mirror::test::input_vector<float>(op, g + 1, lengths[1]);
          Grads grads{mirror::test::input_vector<float>(op, g, lengths[0]), std::span<float>(mem),
                      mirror::test::input_vector<double>(op, g, lengths[2]),
                      mirror::test::input_vector<float>(op, g + 2, lengths[3]), std::vector<float>{},
                      mirror::test::input_vector<float>(op, g + 3, lengths[5])};
          std::vector<float> span_copy = mem;
          Grads before = grads;
          std::get<1>(before) = std::span<float>(span_copy);
          auto buckets = ctx.gradient_buckets(op, grads, cap, mirror::sharded);
          for (const std::size_t i : {std::size_t{5}, std::size_t{1}, std::size_t{4}, std::size_t{3}, std::size_t{0},
                                      std::size_t{2}}) {
            buckets.ready(i);
          }
          buckets.finish();
          // Reference: the blocking reduce_scatter of each leaf on its own. NCCL on three ranks
          // or more may order an element's sum by its position, which packing moves: there, the
          // rounding of another order.
          const auto check = [&](const auto& leaf, auto reference) {
            using E = typename decltype(reference)::value_type;
            const auto cut = mirror::backend::cut_of(reference.size(), R, g);
            const auto mine = ctx.reduce_scatter(op, reference);
            bool same = mine.size() == cut.second;
            if (CONFORMANCE_MEAN_IS_PREMUL_SUM != 0 && R >= 3 && op != ReduceOp::max) {
              const double scale = R * conformance::input_scale<E>(op, R);
              for (std::size_t i = 0; same && i < cut.second; ++i) {
                same = conformance::within_premul_sum_rounding(leaf[cut.first + i], mine[i], R, scale);
              }
            } else {
              same = same && mirror::test::same_bits(leaf.data() + cut.first, mine.data(), cut.second);
            }
            if (!same) ++wrong;
          };
          check(std::get<0>(grads), std::get<0>(before));
          check(mem, std::vector<float>(span_copy));
          check(std::get<2>(grads), std::get<2>(before));
          check(std::get<3>(grads), std::get<3>(before));
          check(std::get<5>(grads), std::get<5>(before));
        });
        REQUIRE(wrong == 0);
      }
    }
  }
}
