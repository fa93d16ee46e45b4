// SPDX-License-Identifier: Apache-2.0
// mirror/strategy.hpp: run's argument passing and result typing, reduce (with and without
// axis0), local_results, broadcast, construction errors and error propagation.

#include <boost/hana/tuple.hpp>
#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/reference.hpp"

using mirror::ReduceOp;
using Threads = mirror::devices::Threads;
using S = mirror::Strategy<Threads>;

namespace {
template <class F>
using run_t = decltype(std::declval<S&>().run(std::declval<F>()));
auto plain = [](auto& ctx) { return ctx.replica_id_in_sync_group(); };
auto synced = [](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); };
auto nothing = [](auto&) {};
auto tuple = [](auto& ctx) { return std::tuple{1.0, ctx.all_reduce(ReduceOp::sum, 1)}; };
auto pair = [](auto& ctx) { return std::pair{ctx.all_reduce(ReduceOp::sum, 1), 2.0f}; };
auto htuple = [](auto& ctx) { return boost::hana::make_tuple(ctx.all_reduce(ReduceOp::sum, 1), 'x'); };
auto no_ctx = [] { return 7; };
}  // namespace

static_assert(std::is_same_v<run_t<decltype(plain)>, mirror::PerReplica<int>>);
static_assert(std::is_same_v<run_t<decltype(synced)>, mirror::Mirrored<int>>);
static_assert(std::is_void_v<run_t<decltype(nothing)>>);
static_assert(std::is_same_v<run_t<decltype(tuple)>, std::tuple<mirror::PerReplica<double>, mirror::Mirrored<int>>>);
static_assert(std::is_same_v<run_t<decltype(pair)>, std::pair<mirror::Mirrored<int>, mirror::PerReplica<float>>>);
static_assert(std::is_same_v<run_t<decltype(htuple)>, boost::hana::tuple<mirror::Mirrored<int>, mirror::PerReplica<char>>>);
static_assert(std::is_same_v<run_t<decltype(no_ctx)>, mirror::PerReplica<int>>);

TEST_CASE("run calls fn once per replica, with or without the context", "[strategy][run]") {
  S s{{.replicas = 5}};
  REQUIRE(s.num_replicas_in_sync() == 5);
  std::atomic<int> calls{0};
  s.run([&] { ++calls; });
  REQUIRE(calls == 5);
  const auto ids = s.run(plain);
  for (int r = 0; r < 5; ++r) REQUIRE(ids[static_cast<std::size_t>(r)] == r);
  const auto sevens = s.run(no_ctx);
  for (int v : sevens) REQUIRE(v == 7);
}

TEST_CASE("run passes PerReplica components, Mirrored copies and shared values", "[strategy][run]") {
  S s{{.replicas = 3}};
  mirror::PerReplica<std::vector<int>> per({{0}, {10}, {20}});
  const auto mirrored = s.broadcast(std::string("same"));
  const std::vector<double> shared(4, 1.5);
  std::atomic<int> same_address{0};
  const auto seen = s.run(
      [&](auto& ctx, std::vector<int>& mine, const std::string& copy, const std::vector<double>& all) {
        mine.push_back(ctx.replica_id_in_sync_group());  // T& for a non-const lvalue PerReplica
        if (&all == &shared) ++same_address;
        return copy + std::to_string(mine.front());
      },
      per, mirrored, shared);
  REQUIRE(same_address == 3);
  REQUIRE(per[1] == std::vector<int>{10, 1});
  REQUIRE(seen[2] == "same20");
  // a const PerReplica arrives as const T&
  const mirror::PerReplica<int> cper({1, 2, 3});
  const auto doubled = s.run([](const int& x) { return 2 * x; }, cper);
  REQUIRE(std::vector<int>(doubled.begin(), doubled.end()) == std::vector<int>{2, 4, 6});
}

TEST_CASE("run rejects a PerReplica argument of the wrong size before any replica starts", "[strategy][run][errors]") {
  S s{{.replicas = 3}};
  std::atomic<int> calls{0};
  mirror::PerReplica<int> two({1, 2});
  REQUIRE_THROWS_MATCHES(s.run([&](int) { ++calls; }, two), mirror::shape_error, mirror::test::what(Catch::Contains("argument 0 has 2 components but the strategy has 3 replicas")));
  REQUIRE(calls == 0);
}

TEST_CASE("run reports the lowest failing replica and keeps mirror errors as they are", "[strategy][run][errors]") {
  S s{{.replicas = 4}};
  SECTION("std exceptions become replica_error with the original nested") {
    try {
      s.run([](auto& ctx) {
        if (ctx.replica_id_in_sync_group() >= 2) throw std::out_of_range("index " + std::to_string(ctx.replica_id_in_sync_group()));
      });
      FAIL("no exception");
    } catch (const mirror::replica_error& e) {
      REQUIRE(e.replica() == 2);
      REQUIRE_THAT(e.what(), Catch::Contains("replica 2") && Catch::Contains("index 2"));
      REQUIRE_THROWS_AS(e.rethrow_nested(), std::out_of_range);
    }
  }
  SECTION("a non-std exception") {
    REQUIRE_THROWS_MATCHES(s.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 3) throw 42;
    }), mirror::replica_error, mirror::test::what(Catch::Contains("not derived from std::exception")));
  }
  SECTION("a mirror::error thrown in fn reaches the caller as itself") {
    REQUIRE_THROWS_AS(s.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) throw mirror::aggregation_error("mine");
    }),
                      mirror::aggregation_error);
  }
  const auto ok = s.run(synced);
  REQUIRE(ok.primary() == 4);
}

namespace {
// Counts live objects, so a test can see that every per-replica result run builds is destroyed
// exactly once (run keeps small ones in the runtime's per-replica result areas, larger ones
// in a vector).
template <std::size_t Bytes>
struct counted {
  static inline std::atomic<int> alive{0};
  int value;
  std::array<unsigned char, Bytes> pad{};
  explicit counted(int v) : value(v) { ++alive; }
  counted(counted&& o) noexcept : value(o.value), pad(o.pad) { ++alive; }
  counted(const counted& o) : value(o.value), pad(o.pad) { ++alive; }
  ~counted() { --alive; }
};
}  // namespace

TEMPLATE_TEST_CASE("run's per-replica results are each destroyed once, also when a replica throws", "[strategy][run]",
                   counted<4>, counted<36>, counted<96>) {
  // 4 + 4 bytes and 40 + 8 bytes fit the threads runtime's 48-byte result area (the optional
  // included); 100 + 4 bytes do not.
  using C = TestType;
  S s{{.replicas = 4}};
  {
    const auto out = s.run([](auto& ctx) { return C(ctx.replica_id_in_sync_group() * 10); });
    REQUIRE(out.size() == 4);
    for (std::size_t r = 0; r < 4; ++r) REQUIRE(out[r].value == static_cast<int>(r) * 10);
    REQUIRE(C::alive == 4);
  }
  REQUIRE(C::alive == 0);
  REQUIRE_THROWS_AS(s.run([](auto& ctx) {
    if (ctx.replica_id_in_sync_group() == 2) throw std::out_of_range("no result");
    return C(ctx.replica_id_in_sync_group());
  }),
                    mirror::replica_error);
  REQUIRE(C::alive == 0);
  // and the next run's results are the next run's
  const auto again = s.run([](auto& ctx) { return C(ctx.replica_id_in_sync_group() + 1); });
  for (std::size_t r = 0; r < 4; ++r) REQUIRE(again[r].value == static_cast<int>(r) + 1);
}

TEMPLATE_TEST_CASE("run's Mirrored results are each destroyed once, also when a replica throws", "[strategy][run]",
                   counted<4>, counted<96>) {
  // fn returns Synced<C> (from merge_call): run unwraps each into the Mirrored<C>'s copies.
  using C = TestType;
  S s{{.replicas = 3}};
  {
    const mirror::Mirrored<C> out = s.run([](auto& ctx) { return ctx.merge_call([](auto&) { return C(5); }); });
    REQUIRE(out.size() == 3);
    for (const C& c : out) REQUIRE(c.value == 5);
    REQUIRE(C::alive == 3);
  }
  REQUIRE(C::alive == 0);
  REQUIRE_THROWS_AS(s.run([](auto& ctx) {
    auto shared = ctx.merge_call([](auto&) { return C(6); });
    if (ctx.replica_id_in_sync_group() == 1) throw std::out_of_range("after the merge");
    return shared;
  }),
                    mirror::replica_error);
  REQUIRE(C::alive == 0);
}

namespace {
// Copies fail once `budget` reaches 0: a copy that throws half-way through a PerReplica.
// (Replicas build theirs concurrently: atomic counts.)
struct fragile {
  static inline std::atomic<int> alive{0};
  static inline std::atomic<int> budget{1 << 30};
  int value;
  explicit fragile(int v) : value(v) { ++alive; }
  fragile(const fragile& o) : value(o.value) {
    if (budget-- == 0) throw std::runtime_error("copy failed");
    ++alive;
  }
  ~fragile() { --alive; }
};
struct alignas(64) wide {
  float x;
};
}  // namespace

TEST_CASE("PerReplica and Mirrored copy, move and assign their components", "[strategy][per_replica]") {
  S s{{.replicas = 4}};
  {
    const auto original = s.run([](auto& ctx) { return fragile(ctx.replica_id_in_sync_group()); });
    REQUIRE(fragile::alive == 4);
    auto copy = original;  // NOLINT(performance-unnecessary-copy-initialization): the copy is under test
    REQUIRE(fragile::alive == 8);
    for (std::size_t r = 0; r < 4; ++r) REQUIRE(copy[r].value == static_cast<int>(r));
    auto moved = std::move(copy);
    REQUIRE(fragile::alive == 8);
    REQUIRE(copy.size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from value is empty
    copy = moved;
    REQUIRE(fragile::alive == 12);
    // The third copy throws: the two already made are destroyed, the target is unchanged.
    fragile::budget = 2;
    REQUIRE_THROWS_MATCHES(copy = original, std::runtime_error, mirror::test::what("copy failed"));
    fragile::budget = 1 << 30;
    REQUIRE(fragile::alive == 12);
    REQUIRE(copy.size() == 4);
  }
  REQUIRE(fragile::alive == 0);

  const mirror::Mirrored<std::vector<int>> m = s.broadcast(std::vector<int>{1, 2, 3});
  mirror::Mirrored<std::vector<int>> m2 = m;
  REQUIRE(m2.size() == 4);
  REQUIRE(m2.primary() == std::vector<int>{1, 2, 3});
  REQUIRE(&m2.primary() != &m.primary());
}

TEST_CASE("run's results keep their alignment, and fn may return a reference", "[strategy][run]") {
  S s{{.replicas = 3}};
  const auto out = s.run([](auto& ctx) { return wide{static_cast<float>(ctx.replica_id_in_sync_group())}; });
  for (std::size_t r = 0; r < 3; ++r) {
    REQUIRE(reinterpret_cast<std::uintptr_t>(&out[r]) % 64 == 0);
    REQUIRE(out[r].x == static_cast<float>(r));
  }
  const std::vector<int> shared{4, 5, 6};
  const auto copies = s.run([&]() -> const std::vector<int>& { return shared; });
  static_assert(std::is_same_v<decltype(copies), const mirror::PerReplica<std::vector<int>>>);
  for (const auto& c : copies) {
    REQUIRE(c == shared);
    REQUIRE(c.data() != shared.data());
  }
}

TEST_CASE("run does not nest, and concurrent runs are serialised", "[strategy][run]") {
  S s{{.replicas = 2}};
  REQUIRE_THROWS_MATCHES(s.run([&] { s.run([] {}); }), mirror::error, mirror::test::what(Catch::Contains("runs do not nest")));
  std::vector<std::thread> users;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    users.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const auto out = s.run([&](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, t + i); });
        if (out.primary() != 2 * (t + i)) ++wrong;
      }
    });
  }
  for (auto& u : users) u.join();
  REQUIRE(wrong == 0);
}

TEST_CASE("construction checks the device and ops settings", "[strategy][errors]") {
  REQUIRE_THROWS_MATCHES((S{{.replicas = 0}}), std::invalid_argument, mirror::test::what(Catch::Contains("replicas must be >= 1")));
  using R1 = mirror::Strategy<Threads, mirror::ops::ReductionToOneDevice>;
  REQUIRE_THROWS_MATCHES((R1{{.replicas = 4}, {.reduce_to = 4}}), std::invalid_argument, mirror::test::what(Catch::Contains("reduce_to must be in 0..3")));
  REQUIRE_NOTHROW(R1{{.replicas = 4}, {.reduce_to = 3}});
}

TEMPLATE_TEST_CASE("reduce equals a serial reference", "[strategy][reduce]", float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  for (int R : {1, 2, 3, 8}) {
    S s{{.replicas = R}};
    for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{300001}}) {  // the last takes the parallel path
      for (auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        const auto v = s.run([&](auto& ctx) { return mirror::test::input_vector<T>(op, ctx.replica_id_in_sync_group(), n); });
        const std::vector<T> out = s.reduce(op, v);
        const std::vector<T> expected = mirror::test::serial_reference<T>(op, R, n);
        REQUIRE(mirror::test::same_bits(out.data(), expected.data(), n));
      }
    }
  }
}

TEST_CASE("reduce: mean keeps the element type, shapes must match", "[strategy][reduce]") {
  S s{{.replicas = 4}};
  const mirror::PerReplica<int> v({1, 2, 2, 2});
  REQUIRE(s.reduce(ReduceOp::mean, v) == 1);  // 7 / 4 in int
  const mirror::PerReplica<double> d({1, 2, 2, 2});
  REQUIRE(s.reduce(ReduceOp::mean, d) == 1.75);
  const mirror::PerReplica<std::vector<float>> ragged({{1, 2}, {1, 2}, {1, 2, 3}, {1, 2}});
  REQUIRE_THROWS_MATCHES(s.reduce(ReduceOp::sum, ragged), mirror::shape_error, mirror::test::what(Catch::Contains("3 elements on replica 2 but 2 on replica 0")));
  // In a nest: the first differing leaf of the lowest replica, by position and type.
  using Nest = std::tuple<std::vector<float>, std::pair<int, std::vector<double>>>;
  const mirror::PerReplica<Nest> nests({Nest{{1}, {1, {1, 2}}}, Nest{{1}, {1, {1}}}, Nest{{1, 2}, {1, {1, 2}}},
                                        Nest{{1}, {1, {1, 2}}}});
  REQUIRE_THROWS_MATCHES(s.reduce(ReduceOp::sum, nests), mirror::shape_error, mirror::test::what(Catch::Contains("shape mismatch at leaf 2 (std::vector<double") &&
                          Catch::Contains("1 elements on replica 1 but 2 on replica 0")));
}

TEST_CASE("reduce rejects a value whose component count is not the replica count", "[strategy][reduce][errors]") {
  // Issue 33: no components was a segmentation fault, and four components on three replicas
  // reduced them all; run rejects both, and reduce must too, naming both counts.
  S s{{.replicas = 3}};
  const mirror::PerReplica<int> none(std::vector<int>{});
  const mirror::PerReplica<int> four({1, 2, 3, 4});
  const mirror::PerReplica<std::vector<double>> batches({{1.0}, {2.0}, {3.0}, {4.0}});
  REQUIRE_THROWS_AS(s.reduce(ReduceOp::sum, none), mirror::shape_error);
  REQUIRE_THROWS_AS(s.reduce(ReduceOp::sum, four), mirror::shape_error);
  REQUIRE_THROWS_AS(s.reduce(ReduceOp::sum, batches, mirror::axis0), mirror::shape_error);
  REQUIRE_THROWS_AS(s.reduce(ReduceOp::mean, mirror::PerReplica<std::vector<double>>(std::vector<std::vector<double>>{}),
                             mirror::axis0),
                    mirror::shape_error);
  REQUIRE_THROWS_MATCHES(s.reduce(ReduceOp::sum, none), mirror::shape_error, mirror::test::what(Catch::Contains("value has 0 components") &&
                                                         Catch::Contains("the strategy has 3 replicas")));
  REQUIRE_THROWS_MATCHES(s.reduce(ReduceOp::max, four), mirror::shape_error, mirror::test::what(Catch::Contains("value has 4 components") &&
                                                         Catch::Contains("the strategy has 3 replicas")));
  REQUIRE_THROWS_MATCHES(s.reduce(ReduceOp::sum, batches, mirror::axis0), mirror::shape_error, mirror::test::what(Catch::Contains("reduce(op, value, axis0)") && Catch::Contains("4 components")));
  REQUIRE(s.reduce(ReduceOp::sum, mirror::PerReplica<int>({1, 2, 3})) == 6);  // the right count still works
}

TEST_CASE("reduce with axis0 reduces the batch dimension too", "[strategy][reduce][axis0]") {
  S s{{.replicas = 3}};
  const mirror::PerReplica<std::vector<double>> batches({{1, 2, 3}, {4}, {}});
  REQUIRE(s.reduce(ReduceOp::sum, batches, mirror::axis0) == 10.0);
  REQUIRE(s.reduce(ReduceOp::mean, batches, mirror::axis0) == 2.5);
  REQUIRE(s.reduce(ReduceOp::min, batches, mirror::axis0) == 1.0);
  REQUIRE(s.reduce(ReduceOp::max, batches, mirror::axis0) == 4.0);
  REQUIRE(s.reduce(ReduceOp::prod, batches, mirror::axis0) == 24.0);
  // a nest: tuple of (vector<float>, array<int, 2>) gives tuple of (float, int)
  const mirror::PerReplica<std::tuple<std::vector<float>, std::array<int, 2>>> nest(
      {{{1.0f, 2.0f}, {1, 1}}, {{3.0f}, {2, 2}}, {{}, {3, 4}}});
  const std::tuple<float, int> r = s.reduce(ReduceOp::sum, nest, mirror::axis0);
  REQUIRE(r == std::tuple{6.0f, 13});
  // nothing at all: floats give NaN (TF), integers an error
  const mirror::PerReplica<std::vector<float>> empty({{}, {}, {}});
  REQUIRE(std::isnan(s.reduce(ReduceOp::mean, empty, mirror::axis0)));
  REQUIRE(s.reduce(ReduceOp::sum, empty, mirror::axis0) == 0.0f);
  const mirror::PerReplica<std::vector<int>> empty_ints({{}, {}, {}});
  REQUIRE_THROWS_AS(s.reduce(ReduceOp::mean, empty_ints, mirror::axis0), mirror::shape_error);
}

TEST_CASE("local_results and broadcast", "[strategy]") {
  S s{{.replicas = 3}};
  const auto m = s.broadcast(std::vector<int>{1, 2});
  const auto copies = s.local_results(m);
  REQUIRE(copies.size() == 3);
  for (const auto& c : copies) REQUIRE(c == std::vector<int>{1, 2});
  REQUIRE(m.primary() == std::vector<int>{1, 2});
  const auto per = s.run(plain);
  const auto parts = s.local_results(per);
  REQUIRE(std::vector<int>(parts.begin(), parts.end()) == std::vector<int>{0, 1, 2});
}

TEST_CASE("PerReplica<bool> and Mirrored<bool> are ordinary contiguous ranges", "[strategy][per_replica]") {
  // std::vector<bool> would hand out proxies (and dangling references from operator[]).
  S s{{.replicas = 3}};
  const auto first = s.run([](auto& ctx) { return ctx.replica_id_in_sync_group() == 0; });
  REQUIRE((first[0] && !first[1] && !first[2]));
  const std::span<const bool> parts = s.local_results(first);
  REQUIRE(parts.size() == 3);
  mirror::PerReplica<bool> flags(std::vector<bool>{false, false, true});
  flags[1] = true;
  const auto copy = flags;
  REQUIRE((copy[1] && copy[2] && !copy[0]));
  REQUIRE(s.broadcast(true).primary());
}
