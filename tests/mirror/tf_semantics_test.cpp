// SPDX-License-Identifier: Apache-2.0
// TensorFlow's numbers (from its tests and docstrings; a case that reproduces a TF test names
// it), and the places where mirror deliberately differs
// (docs/tensorflow.md#where-mirror-differs-on-purpose).

#include <catch2/catch.hpp>
#include <array>
#include <cmath>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::ReduceOp;
using Threads = mirror::devices::Threads;

TEST_CASE("tf: hierarchical copy main devices rotate with the pack index (n = 4, derived from TF)", "[tf][hierarchical_copy]") {
  using H = mirror::ops::HierarchicalCopy;
  const std::pair<int, int> mains[] = {{0, 2}, {1, 3}, {2, 0}, {3, 1}};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto p = H::plan_for(i, 4);
    CAPTURE(i);
    REQUIRE(p.main0 == mains[i].first);
    REQUIRE(p.main1 == mains[i].second);
  }
  // DGX-1, 8 GPUs: two groups of four
  const auto p = H::plan_for(0, 8);
  REQUIRE((p.group0_begin == 0 && p.group0_end == 4 && p.group1_begin == 4 && p.group1_end == 8));
  // pack 5 of 8: main0 = 5 in the upper group, main1 its counterpart 1
  const auto q = H::plan_for(5, 8);
  REQUIRE((q.main0 == 5 && q.main1 == 1 && q.group0_begin == 4 && q.group1_end == 4));
}

TEST_CASE("tf: odd replica counts include the last replica (TF drops it)", "[tf][hierarchical_copy]") {
  using H = mirror::ops::HierarchicalCopy;
  for (int n : {3, 5, 7}) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
      const auto p = H::plan_for(i, n);
      CAPTURE(n, i);
      // the groups cover every replica exactly once, and each main is in its own group
      REQUIRE((p.group0_end - p.group0_begin) + (p.group1_end - p.group1_begin) == n);
      REQUIRE((p.main0 >= p.group0_begin && p.main0 < p.group0_end));
      REQUIRE((p.main1 >= p.group1_begin && p.main1 < p.group1_end));
    }
  }
  mirror::Strategy<Threads, H> s{{.replicas = 3}, {.num_packs = 1}};
  const auto out = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, ctx.replica_id_in_sync_group() + 1); });
  for (int v : out) REQUIRE(v == 1 + 2 + 3);  // TF would give 1 + 2
}

TEST_CASE("tf: packing splits total / num_packs, the last pack takes the rest", "[tf][hierarchical_copy]") {
  using H = mirror::ops::HierarchicalCopy;
  // total 10, 3 packs -> [3, 3, 4]
  REQUIRE(H::pack_range(0, 3, 10) == std::pair<std::size_t, std::size_t>{0, 3});
  REQUIRE(H::pack_range(1, 3, 10) == std::pair<std::size_t, std::size_t>{3, 6});
  REQUIRE(H::pack_range(2, 3, 10) == std::pair<std::size_t, std::size_t>{6, 10});
  // total 1, 8 packs (TF's HierarchicalCopyAllReduce(8) test with scalars) -> [0 x 7, 1]
  for (std::size_t i = 0; i < 7; ++i) REQUIRE(H::pack_range(i, 8, 1).first == H::pack_range(i, 8, 1).second);
  REQUIRE(H::pack_range(7, 8, 1) == std::pair<std::size_t, std::size_t>{0, 1});
  // ... and the reduction is still right with empty packs
  mirror::Strategy<Threads, H> s{{.replicas = 4}, {.num_packs = 8}};
  const auto out = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1.0f); });
  REQUIRE(out.primary() == 4.0f);
  REQUIRE_THROWS_AS((mirror::Strategy<Threads, H>{{.replicas = 2}, {.num_packs = -1}}), std::invalid_argument);
}

TEST_CASE("tf: CollectiveOpsTest numbers on 4 replicas", "[tf]") {
  mirror::Strategy<Threads> s{{.replicas = 4}};
  SECTION("testReduceDense: [1, 2, 3, 4] -> sum 10, mean 2.5") {
    const auto v = s.run([](auto& ctx) { return float(ctx.replica_id_in_sync_group() + 1); });
    REQUIRE(s.reduce(ReduceOp::sum, v) == 10.0f);
    REQUIRE(s.reduce(ReduceOp::mean, v) == 2.5f);
  }
  SECTION("testBatchReduceDense: [[1,2],[3,4],[5,6],[7,8]] -> [16, 20] and [4, 5]") {
    const auto v = s.run([](auto& ctx) {
      const float r = float(ctx.replica_id_in_sync_group());
      return std::vector<float>{2 * r + 1, 2 * r + 2};
    });
    REQUIRE(s.reduce(ReduceOp::sum, v) == std::vector<float>{16, 20});
    REQUIRE(s.reduce(ReduceOp::mean, v) == std::vector<float>{4, 5});
  }
  SECTION("testAllReduceDense: 1.0 -> N and 1.0; (1, 2) -> (N, 2N) and (1, 2)") {
    const auto out = s.run([](auto& ctx) {
      return std::tuple{ctx.all_reduce(ReduceOp::sum, 1.0f), ctx.all_reduce(ReduceOp::mean, 1.0f),
                        ctx.all_reduce(ReduceOp::sum, std::tuple{1.0f, 2.0f}),
                        ctx.all_reduce(ReduceOp::mean, std::tuple{1.0f, 2.0f})};
    });
    REQUIRE(std::get<0>(out).primary() == 4.0f);
    REQUIRE(std::get<1>(out).primary() == 1.0f);
    REQUIRE(std::get<2>(out).primary() == std::tuple{4.0f, 8.0f});
    REQUIRE(std::get<3>(out).primary() == std::tuple{1.0f, 2.0f});
  }
}

TEST_CASE("tf: reduce with an axis divides the mean by the global element count", "[tf][axis0]") {
  // TF's docstring: a last batch of 6 split [4, 2] divides by 6, not the mean of the two means.
  mirror::Strategy<Threads> s{{.replicas = 2}};
  const auto batch = s.run([](auto& ctx) {
    return ctx.replica_id_in_sync_group() == 0 ? std::vector<float>{1, 2, 3, 4} : std::vector<float>{5, 6};
  });
  REQUIRE(s.reduce(ReduceOp::mean, batch, mirror::axis0) == 3.5f);  // mean of means would be 4.0
  REQUIRE(s.reduce(ReduceOp::sum, batch, mirror::axis0) == 21.0f);
  // TF turns an int mean with an axis into a float (truediv: 2/3); mirror keeps the element type.
  const auto ints = s.run([](auto& ctx) {
    return ctx.replica_id_in_sync_group() == 0 ? std::vector<int>{0, 1} : std::vector<int>{1};
  });
  REQUIRE(s.reduce(ReduceOp::mean, ints, mirror::axis0) == 0);
}

TEST_CASE("tf: run returns each replica's value in replica order (testFunctionInCallForEachReplica)", "[tf][run]") {
  mirror::Strategy<Threads> s{{.replicas = 2}};
  const auto ids = s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });
  REQUIRE(std::vector<int>(ids.begin(), ids.end()) == std::vector<int>{0, 1});
}

TEST_CASE("tf: every replica's value counts, also for a Mirrored value (no same-object shortcut)", "[tf][reduce]") {
  mirror::Strategy<Threads> s{{.replicas = 3}};
  const auto m = s.broadcast(2.0);
  REQUIRE(s.reduce(ReduceOp::sum, m) == 6.0);   // TF's same-object shortcut would give 2.0
  REQUIRE(s.reduce(ReduceOp::mean, m) == 2.0);
  const auto synced = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
  REQUIRE(s.reduce(ReduceOp::sum, synced) == 9);
}

// tensorflow/python/distribute/strategy_gather_test.py. TF runs these on
// 1 and 2 replicas (mirrored_strategy_with_one_cpu / _two_cpus); a TF tensor of shape (rows, cols)
// is a mirror::matrix with `cols` columns. Each expected shape is TF's own formula:
// sum(range(N + 1)) rows for replica r's (r + 1, 1).
TEST_CASE("tf: testGatherDiffShapeAtAxis0 and testAllGatherDiffShapeAtAxis0: (1, 1) and (2, 1) give (3, 1)",
          "[tf][gather]") {
  for (const int n : {1, 2, 4}) {
    CAPTURE(n);
    mirror::Strategy<Threads> s{{.replicas = n}};
    // value_fn(ctx) = constant(1, shape=(ctx.replica_id_in_sync_group + 1, 1))
    const auto values = s.distribute_values_from_function([](const mirror::ValueContext& ctx) {
      return mirror::matrix<int>{std::vector<int>(static_cast<std::size_t>(ctx.replica_id_in_sync_group + 1), 1), 1};
    });
    const auto rows = static_cast<std::size_t>(n * (n + 1) / 2);  // sum(range(N + 1)): 3 on 2 replicas
    const mirror::matrix<int> expect{std::vector<int>(rows, 1), 1};
    REQUIRE(s.gather(values, mirror::axis0) == expect);
    const auto all = s.run([](auto& ctx, const mirror::matrix<int>& value) { return ctx.all_gather(value, mirror::axis0); },
                           values);
    REQUIRE(all.size() == static_cast<std::size_t>(n));  // [expect] * num_replicas
    for (const auto& m : all) REQUIRE(m == expect);
  }
}

TEST_CASE("tf: testAllGatherNest1D0Axis: [1, 2, 3] in a nest of two gives [1, 2, 3, 1, 2, 3] on 2 replicas",
          "[tf][gather]") {
  mirror::Strategy<Threads> s{{.replicas = 2}};
  const std::vector<int> single_value{1, 2, 3};
  const auto out = s.run([&](auto& ctx) {
    return ctx.all_gather(std::array<std::vector<int>, 2>{single_value, single_value}, mirror::axis0);  // TF: a list
  });
  const std::vector<int> expect{1, 2, 3, 1, 2, 3};
  for (const auto& nest : out) {
    REQUIRE(nest[0] == expect);
    REQUIRE(nest[1] == expect);
  }
  // testGatherPerReplicaDense1D0Axis: the same through strategy.gather
  const auto values = s.distribute_values_from_function([&](const mirror::ValueContext&) { return single_value; });
  REQUIRE(s.gather(values, mirror::axis0) == expect);
}

TEST_CASE("tf: testGatherRaiseDiffShapeAtNonAxis / testAllGatherRaiseDiffShapeAtNonAxis: (1, 1) and (1, 2) along axis 0 raise",
          "[tf][gather]") {
  // TF: "Dimension 1 in both shapes must be equal"; mirror: a shape_error naming the columns.
  mirror::Strategy<Threads> s{{.replicas = 2}};
  // value_fn(ctx) = constant(1, shape=(1, ctx.replica_id_in_sync_group + 1))
  const auto values = s.distribute_values_from_function([](const mirror::ValueContext& ctx) {
    const auto cols = static_cast<std::size_t>(ctx.replica_id_in_sync_group + 1);
    return mirror::matrix<int>{std::vector<int>(cols, 1), cols};
  });
  REQUIRE_THROWS_AS(s.gather(values, mirror::axis0), mirror::shape_error);
  REQUIRE_THROWS_AS(s.run([](auto& ctx, const mirror::matrix<int>& value) { return ctx.all_gather(value, mirror::axis0); },
                          values),
                    mirror::shape_error);
}
