// SPDX-License-Identifier: Apache-2.0
// ctx.reduce_scatter, ctx.all_gather, strategy.gather and distribute_values_from_function on
// devices::Cluster<Threads> under mpirun (2 or 3 processes; 1, 2 and 3 local replicas): every
// worker computes every global replica's input, so each result is checked against a serial loop
// over the global replicas, and a reduce-scatter bitwise against the same cut of all_reduce.

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>

#include "mpi/mpi_world.hpp"

#include "support/reference.hpp"

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Ops = mirror::ops::Hierarchical<mirror::ops::ChunkOwnerAllReduce, mirror::ops::MpiAllReduce>;
using Strategy = mirror::Strategy<Cluster, Ops>;
using mirror::ReduceOp;

// One strategy at a time (tests/mpi/cluster_test.cpp says why), rebuilt for another replica
// count or cross-worker order.
std::unique_ptr<Strategy>& shared_strategy() {
  static std::unique_ptr<Strategy> s;
  return s;
}
void drop_strategy() { shared_strategy().reset(); }
Strategy& strategy_with(int replicas, bool deterministic = false) {
  std::unique_ptr<Strategy>& s = shared_strategy();
  static bool ordered = false;
  if (!s || s->num_replicas_in_sync() != world_size() * replicas || ordered != deterministic) {
    s.reset();
    s = std::make_unique<Strategy>(Cluster{.local = {.replicas = replicas}, .timeout = std::chrono::seconds(30)},
                                   Ops{.cross = {.deterministic = deterministic}});
    ordered = deterministic;
  }
  return *s;
}

// Global replica g's element i: reproducible on every worker, not exactly representable sums
// for floating point (so that the order of a sum shows in its bits), near 1 for prod.
template <class T>
T input(int g, std::size_t i, ReduceOp op) {
  const std::uint64_t h = (static_cast<std::uint64_t>(g) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull + 7);
  const auto bits = (h ^ (h >> 29)) * 0x94d049bb133111ebull;
  const double u = static_cast<double>(bits >> 11) / 9007199254740992.0;  // [0, 1)
  if constexpr (std::is_floating_point_v<T>) {
    return op == ReduceOp::prod ? static_cast<T>(0.9 + 0.2 * u) : static_cast<T>(2 * u - 1);
  } else {
    return op == ReduceOp::prod ? static_cast<T>(1 + (bits >> 60) % 2) : static_cast<T>(static_cast<int>(u * 2001) - 1000);
  }
}

template <class T>
std::vector<T> input_vector(int g, std::size_t n, ReduceOp op) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(g, i, op);
  return v;
}

using mirror::test::fold;

// The serial loop over the global replicas 0..N-1 in order; `hierarchical` folds each worker's
// R replicas first and then the workers in worker order (Hierarchical's order with
// MpiAllReduce{.deterministic = true}).
template <class T>
std::vector<T> reference(ReduceOp op, int W, int R, std::size_t n, bool hierarchical) {
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    T total = input<T>(0, i, op);
    if (hierarchical) {
      for (int w = 0; w < W; ++w) {
        T part = input<T>(w * R, i, op);
        for (int r = 1; r < R; ++r) part = fold(op, part, input<T>(w * R + r, i, op));
        total = w == 0 ? part : fold(op, total, part);
      }
    } else {
      for (int g = 1; g < W * R; ++g) total = fold(op, total, input<T>(g, i, op));
    }
    if (op == ReduceOp::mean) total = static_cast<T>(total / static_cast<T>(W * R));
    out[i] = total;
  }
  return out;
}

template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && mirror::test::same_bits(a.data(), b.data(), a.size());
}

template <class T>
void check_close(std::span<const T> got, std::span<const T> want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      REQUIRE(std::abs(got[i] - want[i]) <= 1e-4 * (1 + std::abs(want[i])));
    } else {
      REQUIRE(got[i] == want[i]);
    }
  }
}

template <class T>
void reduce_scatter_case(int R, bool deterministic) {
  Strategy& s = strategy_with(R, deterministic);
  const int W = world_size(), N = W * R;
  constexpr std::size_t large = 80 * 1024 / sizeof(T);  // > 64 KiB: Open MPI's larger algorithms
  constexpr std::size_t wide = 4000 / sizeof(T);         // in the agreement check's wide message
  // The largest all-reduce in cuts (4016 bytes a worker: group/impl.hpp), whose reduce-scatter
  // must give its bits: in cuts too, or where R spreads a worker's range past 4016 bytes, an
  // all-to-all; and one element more, past the cuts.
  const std::size_t cuts = static_cast<std::size_t>(W) * (4016 / sizeof(T));
  // Past 4 MiB an all-reduce in MPI's order goes in pieces (group/impl.hpp), and so must the
  // reduce-scatter that gives its bits: three pieces here. The op changes nothing there: sum only.
  constexpr std::size_t pieces = (5u << 20) / sizeof(T) + 7;
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::min, ReduceOp::max, ReduceOp::prod}) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(N - 1),
                                static_cast<std::size_t>(2 * N + 1), wide, cuts, cuts + 1, large + 3, pieces}) {
      if (n == pieces && op != ReduceOp::sum) continue;
      CAPTURE(W, R, deterministic, mirror::to_string(op), n, sizeof(T));
      const auto results = s.run([&](auto& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        const std::vector<T> mine = input_vector<T>(g, n, op);
        std::vector<T> cut = ctx.reduce_scatter(op, mine);
        std::vector<T> all = *ctx.all_reduce(op, mine);
        // The span form: in place into this replica's cut, the rest of the span as it was.
        std::vector<T> buffer = mine;
        const std::span<T> view = ctx.reduce_scatter(op, std::span<T>(buffer));
        return std::make_tuple(cut, all, buffer, static_cast<std::size_t>(view.data() - buffer.data()), view.size());
      });
      const std::vector<T> serial = reference<T>(op, W, R, n, false);
      const std::vector<T> ordered = reference<T>(op, W, R, n, true);
      const auto& [cuts, alls, buffers, offsets, lengths] = results;
      for (int l = 0; l < R; ++l) {
        const int g = world_rank() * R + l;
        const auto [first, count] = mirror::backend::cut_of(n, N, g);
        const std::vector<T>& cut = cuts[static_cast<std::size_t>(l)];
        const std::span<const T> all(alls[static_cast<std::size_t>(l)]);
        REQUIRE(cut.size() == count);
        CHECK(same_bits<T>(cut, all.subspan(first, count)));
        check_close<T>(cut, std::span<const T>(serial).subspan(first, count));
        // In cuts, the elements fold in worker order as in a deterministic run.
        const bool in_cuts = W > 1 && n * sizeof(T) > 4016 && (n + static_cast<std::size_t>(W) - 1) /
                                                                       static_cast<std::size_t>(W) * sizeof(T) <= 4016;
        if (deterministic || !std::is_floating_point_v<T> || in_cuts) {
          CHECK(same_bits<T>(cut, std::span<const T>(ordered).subspan(first, count)));
        }
        const std::vector<T>& buffer = buffers[static_cast<std::size_t>(l)];
        const std::vector<T> original = input_vector<T>(g, n, op);
        CHECK(offsets[static_cast<std::size_t>(l)] == first);
        CHECK(lengths[static_cast<std::size_t>(l)] == count);
        CHECK(same_bits<T>(std::span<const T>(buffer).subspan(first, count), cut));
        CHECK(same_bits<T>(std::span<const T>(buffer).first(first), std::span<const T>(original).first(first)));
        CHECK(same_bits<T>(std::span<const T>(buffer).subspan(first + count),
                           std::span<const T>(original).subspan(first + count)));
      }
    }
  }
}

}  // namespace

TEST_CASE("cluster reduce_scatter: every op, float/double/int32, lengths 0, 1, < N, ragged, 4000 bytes, the edge of "
          "the cuts, > 64 KiB, > 4 MiB",
          "[mpi]") {
  for (const int R : {1, 2, 3}) {
    reduce_scatter_case<float>(R, false);
    reduce_scatter_case<double>(R, false);
    reduce_scatter_case<std::int32_t>(R, false);
  }
}

TEST_CASE("cluster reduce_scatter with MpiAllReduce{.deterministic}: the hierarchical serial loop's bits", "[mpi]") {
  for (const int R : {1, 2, 3}) {
    reduce_scatter_case<float>(R, true);
    reduce_scatter_case<double>(R, true);
  }
}

TEST_CASE("cluster reduce_scatter of a nest: leaves of several lengths and element types", "[mpi]") {
  for (const int R : {1, 2, 3}) {
    Strategy& s = strategy_with(R);
    const int W = world_size(), N = W * R;
    const std::size_t na = 3 * static_cast<std::size_t>(N) + 2, nb = 5, nc = 40000;
    const auto results = s.run([&](auto& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      const auto value = std::make_tuple(input_vector<float>(g, na, ReduceOp::sum), input_vector<int>(g, nb, ReduceOp::sum),
                                         input_vector<float>(g, nc, ReduceOp::sum));
      return std::make_tuple(ctx.reduce_scatter(ReduceOp::sum, value), *ctx.all_reduce(ReduceOp::sum, value));
    });
    const auto& [cuts, alls] = results;
    for (int l = 0; l < R; ++l) {
      const int g = world_rank() * R + l;
      CAPTURE(W, R, g);
      const auto& [a, b, c] = cuts[static_cast<std::size_t>(l)];
      const auto& [fa, fb, fc] = alls[static_cast<std::size_t>(l)];
      const auto check = [&](const auto& cut, const auto& full, std::size_t n) {
        using T = typename std::remove_cvref_t<decltype(cut)>::value_type;
        const auto [first, count] = mirror::backend::cut_of(n, N, g);
        REQUIRE(cut.size() == count);
        CHECK(same_bits<T>(cut, std::span<const T>(full).subspan(first, count)));
        const std::vector<T> serial = reference<T>(ReduceOp::sum, W, R, n, false);
        check_close<T>(cut, std::span<const T>(serial).subspan(first, count));
      };
      check(a, fa, na);
      check(b, fb, nb);
      check(c, fc, nc);
    }
  }
}

TEST_CASE("cluster reduce_scatter: lengths that differ across workers are a shape_error on every worker",
          "[mpi][mismatch]") {
  for (const int R : {1, 2}) {
    Strategy& s = strategy_with(R);
    const int w = world_rank();
    try {
      s.run([&](auto& ctx) { ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(10 + (w == 1 ? 1 : 0), 1.f)); });
      FAIL("no shape_error");
    } catch (const mirror::shape_error& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("worker 1 (replicas " + std::to_string(R) + ".." +
                                                        std::to_string(2 * R - 1) + ") reduce-scatters 11 float32"));
      CHECK_THAT(std::string(e.what()), Catch::Contains("worker 0 (replicas 0.." + std::to_string(R - 1) +
                                                        ") reduce-scatters 10 float32"));
    }
    // Nothing is left half-done: the next collective works.
    const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
    CHECK(v.primary() == s.num_replicas_in_sync());
  }
}

TEST_CASE("cluster all_gather: leaves whose lengths differ per global replica (some 0), scalars, the span form",
          "[mpi]") {
  for (const int R : {1, 2, 3}) {
    Strategy& s = strategy_with(R);
    const int W = world_size(), N = W * R;
    CAPTURE(W, R);
    const auto length = [](int g) { return static_cast<std::size_t>(g % 3 == 1 ? 0 : 2 * g + 1); };
    const auto results = s.run([&](auto& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      const auto value = std::make_tuple(input_vector<float>(g, length(g), ReduceOp::sum), g,
                                         input_vector<double>(g, 20000 + static_cast<std::size_t>(g), ReduceOp::sum));
      const auto scalar = ctx.all_gather(1.5f * static_cast<float>(g), mirror::axis0);
      std::vector<int> ids(static_cast<std::size_t>(g + 1), g);
      std::size_t total = 0;
      for (int q = 0; q < ctx.num_replicas_in_sync(); ++q) total += static_cast<std::size_t>(q + 1);
      std::vector<int> out(total, -1);
      ctx.all_gather(std::span<const int>(ids), std::span<int>(out), mirror::axis0);
      return std::make_tuple(*ctx.all_gather(value, mirror::axis0), *scalar, out);
    });
    // The serial concatenation over the global replicas.
    std::vector<float> a;
    std::vector<int> b, ids;
    std::vector<double> c;
    std::vector<float> scalars;
    for (int g = 0; g < N; ++g) {
      const auto va = input_vector<float>(g, length(g), ReduceOp::sum);
      a.insert(a.end(), va.begin(), va.end());
      b.push_back(g);
      const auto vc = input_vector<double>(g, 20000 + static_cast<std::size_t>(g), ReduceOp::sum);
      c.insert(c.end(), vc.begin(), vc.end());
      scalars.push_back(1.5f * static_cast<float>(g));
      ids.insert(ids.end(), static_cast<std::size_t>(g + 1), g);
    }
    const auto& [gathered, gathered_scalars, gathered_ids] = results;
    for (int l = 0; l < R; ++l) {
      const auto& [ga, gb, gc] = gathered[static_cast<std::size_t>(l)];
      CHECK(ga == a);
      CHECK(gb == b);
      CHECK(gc == c);
      CHECK(gathered_scalars[static_cast<std::size_t>(l)] == scalars);
      CHECK(gathered_ids[static_cast<std::size_t>(l)] == ids);
    }
  }
}

// A worker's block of a one-leaf all-gather travels in the counts' message where it fits what the
// message has left (backends/mpi/group/impl.hpp). Up to 8 workers the check is direct messages:
// the words, a length, then up to 4016 - (words + 1) * 8 bytes of block (words = 3 per replica).
// Above (here: MIRROR_MPI_DIRECT_AGREEMENT=1), one fixed slot: 32 bytes per worker for 2 workers
// x 1 replica, 8 for 2 x 2 or 3 x 1 (block_region). The all-gather then makes no exchange of its
// own, and where some worker's block did not fit, every worker exchanges them all. Lengths
// around both edges, equal and unequal across workers (the last worker's longer, or empty),
// every element size, both forms, with the agreement check and without.
TEMPLATE_TEST_CASE("cluster all_gather: small blocks that travel with the counts, around the edge, equal or not",
                   "[mpi]", std::int8_t, std::int16_t, float, double) {
  using T = TestType;
  const int W = world_size();
  const char* const set = std::getenv("MIRROR_MPI_DIRECT_AGREEMENT");
  const std::string before = set != nullptr ? set : "";
  // The strategy's group reads the variable as it is built.
  const auto build = [&](bool direct, bool validate, int R) {
    if (direct) {
      unsetenv("MIRROR_MPI_DIRECT_AGREEMENT");
    } else {
      setenv("MIRROR_MPI_DIRECT_AGREEMENT", "1", 1);
    }
    auto s = std::make_unique<mirror::Strategy<Cluster, Ops>>(
        Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30), .validate_shapes = validate});
    if (before.empty()) {
      unsetenv("MIRROR_MPI_DIRECT_AGREEMENT");
    } else {
      setenv("MIRROR_MPI_DIRECT_AGREEMENT", before.c_str(), 1);
    }
    return s;
  };
  for (const bool direct : {true, false}) {
    for (const bool validate : {true, false}) {
      for (const int R : {1, 2}) {
        drop_strategy();
        const auto s = build(direct, validate, R);
        const int N = W * R;
        const std::size_t Rn = static_cast<std::size_t>(R);
        const std::size_t edge = (4016 - (3 * Rn + 1) * 8) / Rn / sizeof(T);
        std::vector<std::size_t> lengths{0, 1, 8 / sizeof(T), 8 / sizeof(T) + 1, 32 / sizeof(T) / 2, 32 / sizeof(T),
                                         32 / sizeof(T) + 1, 64 / sizeof(T)};
        if (direct) lengths.insert(lengths.end(), {edge - 1, edge, edge + 1});
        for (const std::size_t n : lengths) {
          for (const int shape : {0, 1, 2}) {  // equal; the last worker's one longer; the last worker's empty
            CAPTURE(direct, validate, R, n, shape);
            const auto length = [&](int g) {
              const bool last = g / R == W - 1;
              return shape == 1 && last ? n + 1 : shape == 2 && last ? 0 : n;
            };
            std::vector<T> want;
            for (int g = 0; g < N; ++g) {
              for (std::size_t i = 0; i < length(g); ++i) want.push_back(input<T>(g, i, ReduceOp::sum));
            }
            const auto got = s->run([&](auto& ctx) {
              const int g = ctx.replica_id_in_sync_group();
              std::vector<T> mine(length(g));
              for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = input<T>(g, i, ReduceOp::sum);
              std::vector<T> out(want.size(), T{99});
              ctx.all_gather(std::span<const T>(mine), std::span<T>(out), mirror::axis0);
              return std::make_pair(*ctx.all_gather(mine, mirror::axis0), out);
            });
            for (int l = 0; l < R; ++l) {
              CHECK(got.first[static_cast<std::size_t>(l)] == want);
              CHECK(got.second[static_cast<std::size_t>(l)] == want);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cluster all_gather: a span form's wrong out size, or matrices of other widths, on one worker are a "
          "shape_error on every worker",
          "[mpi][mismatch]") {
  for (const int R : {1, 2}) {
    Strategy& s = strategy_with(R);
    const int w = world_rank();
    const std::size_t N = static_cast<std::size_t>(s.num_replicas_in_sync());
    try {
      s.run([&](auto& ctx) {
        const std::vector<int> in(2, 1);
        std::vector<int> out(2 * N + (w == 1 ? 1 : 0));
        ctx.all_gather(std::span<const int>(in), std::span<int>(out), mirror::axis0);
      });
      FAIL("no shape_error");
    } catch (const mirror::shape_error& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("on replica " + std::to_string(R) + ": out has " +
                                                        std::to_string(2 * N + 1) + " elements"));
    }
    try {
      s.run([&](auto& ctx) {
        mirror::matrix<float> m{std::vector<float>(6, 1.f), w == 1 ? 3u : 2u};
        ctx.all_gather(m, mirror::axis0);
      });
      FAIL("no shape_error");
    } catch (const mirror::shape_error& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("has rows of 3 elements on replica " + std::to_string(R)));
    }
    const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
    CHECK(v.primary() == s.num_replicas_in_sync());
  }
}

TEST_CASE("cluster strategy.gather: every worker's components in global replica order", "[mpi]") {
  for (const int R : {1, 2, 3}) {
    Strategy& s = strategy_with(R);
    const int N = s.num_replicas_in_sync();
    CAPTURE(R, N);
    const auto values = s.distribute_values_from_function([](const mirror::ValueContext& v) {
      return std::make_tuple(std::vector<int>(static_cast<std::size_t>(v.replica_id_in_sync_group % 2 == 0 ? 0 : 3),
                                              v.replica_id_in_sync_group),
                             std::vector<double>{static_cast<double>(v.replica_id_in_sync_group) / 2},
                             mirror::matrix<float>{std::vector<float>(2 * static_cast<std::size_t>(v.replica_id_in_sync_group), 1.f), 2});
    });
    const auto [ints, doubles, matrix] = s.gather(values, mirror::axis0);
    std::vector<int> want_ints;
    std::vector<double> want_doubles;
    for (int g = 0; g < N; ++g) {
      want_ints.insert(want_ints.end(), static_cast<std::size_t>(g % 2 == 0 ? 0 : 3), g);
      want_doubles.push_back(static_cast<double>(g) / 2);
    }
    CHECK(ints == want_ints);
    CHECK(doubles == want_doubles);
    CHECK(matrix.cols == 2u);
    CHECK(matrix.rows() == static_cast<std::size_t>(N * (N - 1) / 2));
    // The same through run's result, a vector leaf per replica.
    const auto per_replica = s.run([](auto& ctx) { return std::vector<int>{ctx.replica_id_in_sync_group(), -1}; });
    std::vector<int> want;
    for (int g = 0; g < N; ++g) want.insert(want.end(), {g, -1});
    CHECK(s.gather(per_replica, mirror::axis0) == want);
  }
}

TEST_CASE("cluster strategy.gather: components of other widths on one worker are a shape_error on every worker",
          "[mpi][mismatch]") {
  Strategy& s = strategy_with(2);
  const int w = world_rank();
  const auto values = s.distribute_values_from_function([&](const mirror::ValueContext& v) {
    return mirror::matrix<float>{std::vector<float>(6, 1.f), (w == 1 && v.replica_id_in_sync_group % 2 == 1) ? 3u : 2u};
  });
  CHECK_THROWS_AS(s.gather(values, mirror::axis0), mirror::shape_error);
  const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
  CHECK(v.primary() == s.num_replicas_in_sync());
}

TEST_CASE("cluster distribute_values_from_function: global ids of W*R", "[mpi]") {
  for (const int R : {1, 2, 3}) {
    Strategy& s = strategy_with(R);
    const int W = world_size(), w = world_rank();
    const auto values = s.distribute_values_from_function(
        [](const mirror::ValueContext& v) { return std::make_pair(v.replica_id_in_sync_group, v.num_replicas_in_sync); });
    REQUIRE(values.size() == static_cast<std::size_t>(R));
    for (int l = 0; l < R; ++l) {
      CHECK(values[static_cast<std::size_t>(l)].first == w * R + l);
      CHECK(values[static_cast<std::size_t>(l)].second == W * R);
    }
    // And run sees them as its replicas' ids.
    const auto same = s.run([](auto& ctx, const std::pair<int, int>& v) { return v.first == ctx.replica_id_in_sync_group(); },
                            values);
    for (int l = 0; l < R; ++l) CHECK(same[static_cast<std::size_t>(l)]);
  }
}

TEST_CASE("cluster: an exception in fn on one worker while the others reduce-scatter or all-gather is an error on "
          "every worker, and the next run works",
          "[mpi][mismatch]") {
  // Without the agreement check the other workers post the reduce-scatter's all-to-all (and the
  // all-gather's count gathering) at once: the failed worker must post their matches (the
  // recovery's dummies) before anything later.
  drop_strategy();
  const int w = world_rank();
  for (const int R : {1, 2}) {
    Strategy s{Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30), .validate_shapes = false}};
    // Gathers of 5 floats travel in one small message; of 5000, as each worker's block to every
    // other (recovery posts the stand-ins of either).
    for (const std::size_t gather : {std::size_t{0}, std::size_t{5}, std::size_t{5000}}) {
      CAPTURE(R, gather);
      try {
        s.run([&](auto& ctx) {
          if (w == 1) throw std::runtime_error("boom");
          if (gather != 0) {
            ctx.all_gather(std::vector<float>(gather, 1.f), mirror::axis0);
          } else {
            ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(1000, 1.f));
          }
        });
        FAIL("no error");
      } catch (const mirror::error& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains("boom"));
      }
      const auto v = s.run([](auto& ctx) { return ctx.reduce_scatter(ReduceOp::sum, std::vector<int>(100, 1)); });
      for (const auto& cut : v) {
        for (const int x : cut) CHECK(x == s.num_replicas_in_sync());
      }
    }
  }
}

namespace {

// Local policies that accumulate in the runtime's scratch: the cluster reduce_scatter must keep
// its copy of the leaves elsewhere (a review found the copy and the accumulator in one buffer).
template <class Local>
void reduce_scatter_with_local_policy(Local local) {
  using S = mirror::Strategy<Cluster, mirror::ops::Hierarchical<Local, mirror::ops::MpiAllReduce>>;
  drop_strategy();
  for (const int R : {2, 3}) {
    CAPTURE(R);
    S s(Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30)}, {.local = local});
    const int W = world_size(), N = W * R;
    const std::size_t n = 3 * 2048 + 5;  // several 8 KiB blocks per replica's part, ragged
    std::vector<float> serial(n, 0.0f);
    for (int g = 0; g < N; ++g) {
      const std::vector<float> x = input_vector<float>(g, n, ReduceOp::sum);
      for (std::size_t i = 0; i < n; ++i) serial[i] += x[i];
    }
    const auto results = s.run([&](auto& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      const auto cut = ctx.reduce_scatter(ReduceOp::sum, input_vector<float>(g, n, ReduceOp::sum));
      const auto all = ctx.all_reduce(ReduceOp::sum, input_vector<float>(g, n, ReduceOp::sum));
      return std::pair{cut, *all};
    });
    const auto& [cuts, alls] = results;
    for (int l = 0; l < R; ++l) {
      const int g = s.worker_index() * R + l;
      const auto [first, count] = mirror::backend::cut_of(n, N, g);
      CAPTURE(g);
      const std::vector<float>& cut = cuts[static_cast<std::size_t>(l)];
      REQUIRE(cut.size() == count);
      CHECK(same_bits<float>(cut, std::span<const float>(alls[static_cast<std::size_t>(l)]).subspan(first, count)));
      check_close<float>(cut, std::span<const float>(serial).subspan(first, count));
    }
  }
}

}  // namespace

TEST_CASE("cluster reduce_scatter with a local policy that accumulates in scratch (ReductionToOneDevice, "
          "HierarchicalCopy)", "[mpi]") {
  reduce_scatter_with_local_policy(mirror::ops::ReductionToOneDevice{.reduce_to = 1});
  reduce_scatter_with_local_policy(mirror::ops::HierarchicalCopy{.num_packs = 2});
}
