// SPDX-License-Identifier: Apache-2.0
// mirror/replica_context.hpp: ids, all_reduce over every nest kind, broadcast, merge_call.

#include <boost/hana/define_struct.hpp>
#include <boost/hana/tuple.hpp>
#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <atomic>
#include <stdexcept>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::ReduceOp;
using S = mirror::Strategy<mirror::devices::Threads>;

namespace {
struct Layer {
  BOOST_HANA_DEFINE_STRUCT(Layer, (std::vector<float>, w), (std::array<float, 2>, b));
};
struct Model {
  BOOST_HANA_DEFINE_STRUCT(Model, (std::array<Layer, 2>, layers), (std::pair<double, int>, stats));
};
}  // namespace

TEST_CASE("the context knows its replica", "[replica_context]") {
  S s{{.replicas = 6}};
  const auto out = s.run([](auto& ctx) { return std::pair{ctx.replica_id_in_sync_group(), ctx.num_replicas_in_sync()}; });
  for (int r = 0; r < 6; ++r) {
    REQUIRE(out.first[static_cast<std::size_t>(r)] == r);
    REQUIRE(out.second[static_cast<std::size_t>(r)] == 6);
  }
}

TEST_CASE("all_reduce walks every nest kind (3 levels) and returns the nest's type", "[replica_context][all_reduce]") {
  S s{{.replicas = 3}};
  const auto out = s.run([](auto& ctx) {
    const float r = float(ctx.replica_id_in_sync_group());
    Model m{{Layer{{r, 1.0f}, {2 * r, 0.0f}}, Layer{{r * r}, {1.0f, -r}}}, {double(r) / 2, int(r) + 1}};
    auto h = boost::hana::make_tuple(r, std::vector<double>(2, double(r)));
    return std::pair{ctx.all_reduce(ReduceOp::sum, m), ctx.all_reduce(ReduceOp::max, h)};
  });
  const Model& sum = out.first.primary();
  REQUIRE(sum.layers[0].w == std::vector<float>{3.0f, 3.0f});
  REQUIRE(sum.layers[0].b == std::array<float, 2>{6.0f, 0.0f});
  REQUIRE(sum.layers[1].w == std::vector<float>{5.0f});
  REQUIRE(sum.layers[1].b == std::array<float, 2>{3.0f, -3.0f});
  REQUIRE(sum.stats.first == 1.5);
  REQUIRE(sum.stats.second == 6);
  const auto& mx = out.second.primary();
  REQUIRE(boost::hana::at_c<0>(mx) == 2.0f);
  REQUIRE(boost::hana::at_c<1>(mx) == std::vector<double>{2.0, 2.0});
  // an empty nest is allowed and does nothing
  const auto none = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, std::tuple<>{}); });
  REQUIRE(none.size() == 3);
}

TEST_CASE("replicas calling different collectives get a shape_error naming both", "[replica_context][errors]") {
  S s{{.replicas = 2}};
  REQUIRE_THROWS_MATCHES(s.run([](auto& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) {
      ctx.all_reduce(ReduceOp::sum, 1);
    } else {
      ctx.broadcast(1);
    }
  }), mirror::shape_error, mirror::test::what(Catch::Contains("replica 0 called all_reduce(sum) at ") &&
                                                           Catch::Contains(" but replica 1 called broadcast(from = 0) at ")));
}

TEST_CASE("broadcast checks its source", "[replica_context][broadcast]") {
  S s{{.replicas = 2}};
  // a mirror::error of its own, as the other collectives' errors are (not a replica_error
  // wrapping std::invalid_argument), from the replica that passed it
  try {
    s.run([](auto& ctx) { ctx.broadcast(1, ctx.replica_id_in_sync_group() == 1 ? 2 : 0); });
    FAIL("no exception");
  } catch (const mirror::replica_error&) {
    FAIL("wrapped in a replica_error");
  } catch (const mirror::error& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("broadcast(value, from = 2) at ") &&
                               Catch::Contains(" on replica 1: from must be a replica id in 0..1"));
  }
  // a fixed-size leaf of the wrong size cannot take the source's value
  std::vector<std::vector<float>> buffers{std::vector<float>(3), std::vector<float>(4)};
  REQUIRE_THROWS_AS(s.run([&](auto& ctx) {
    ctx.broadcast(std::span<float>(buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]));
  }),
                    mirror::shape_error);
}

TEST_CASE("merge_call runs once with every replica's arguments and gives all the result", "[replica_context][merge_call]") {
  S s{{.replicas = 4}};
  std::atomic<int> calls{0};
  const auto out = s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return ctx.merge_call(
        [&](S& strategy, const mirror::PerReplica<int>& ids, const mirror::PerReplica<std::vector<float>>& v) {
          ++calls;
          REQUIRE(&strategy == &s);
          REQUIRE(std::vector<int>(ids.begin(), ids.end()) == std::vector<int>{0, 1, 2, 3});
          // cross-replica APIs work inside merge_call
          return std::pair{strategy.reduce(ReduceOp::sum, v), strategy.reduce(ReduceOp::max, ids)};
        },
        r, std::vector<float>{float(r), 1.0f});
  });
  REQUIRE(calls == 1);
  for (const auto& p : out) {
    REQUIRE(p.first == std::vector<float>{6.0f, 4.0f});
    REQUIRE(p.second == 3);
  }
  // void merge functions, and several merges in one run
  std::atomic<int> total{0};
  s.run([&](auto& ctx) {
    for (int i = 0; i < 3; ++i) ctx.merge_call([&](S&, mirror::PerReplica<int> x) { total += s.reduce(ReduceOp::sum, x); }, i);
  });
  REQUIRE(total == 0 + 4 + 8);
}

TEST_CASE("an exception in a merge function reaches the caller and the strategy stays usable", "[replica_context][merge_call][errors]") {
  S s{{.replicas = 3}};
  REQUIRE_THROWS_MATCHES(s.run([](auto& ctx) {
    return ctx.merge_call([](S&, mirror::PerReplica<int>) -> int { throw std::domain_error("merge failed"); }, 1);
  }), mirror::replica_error, mirror::test::what(Catch::Contains("replica 0 threw: merge failed")));
  const auto ok = s.run([](auto& ctx) { return ctx.merge_call([](S& st, mirror::PerReplica<int> v) { return st.reduce(ReduceOp::sum, v); }, 2); });
  REQUIRE(ok.primary() == 6);
}

TEST_CASE("collectives are matched by their position in fn: swapped calls of the same shape are a shape_error",
          "[replica_context][errors]") {
  // The agreement check compares each collective's number in fn, not only its kind, op, nest
  // and sizes. An all_reduce of an empty nest moves nothing and waits for no one, but it is a
  // collective: replica 0 calls it first and replica 1 second, so their all_reduce of a float
  // is collective #2 on replica 0 and #1 on replica 1, alike in every other way.
  S s{{.replicas = 2}};
  REQUIRE_THROWS_AS(s.run([](auto& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) ctx.all_reduce(ReduceOp::sum, std::tuple<>{});
    ctx.all_reduce(ReduceOp::sum, 1.0f);
    if (ctx.replica_id_in_sync_group() == 1) ctx.all_reduce(ReduceOp::sum, std::tuple<>{});
  }),
                    mirror::shape_error);
  REQUIRE_THROWS_MATCHES(s.run([](auto& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) ctx.all_reduce(ReduceOp::sum, std::tuple<>{});
    ctx.all_reduce(ReduceOp::sum, 1.0f);
    if (ctx.replica_id_in_sync_group() == 1) ctx.all_reduce(ReduceOp::sum, std::tuple<>{});
  }), mirror::shape_error, mirror::test::what(Catch::Contains("collective #2") && Catch::Contains("its collective #1")));
  // In the same positions they agree.
  const auto ok = s.run([](auto& ctx) {
    ctx.all_reduce(ReduceOp::sum, std::tuple<>{});
    return ctx.all_reduce(ReduceOp::sum, 1.0f);
  });
  REQUIRE(ok.primary() == 2.0f);
}
