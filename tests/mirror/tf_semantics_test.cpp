// SPDX-License-Identifier: Apache-2.0
// TensorFlow's numbers (../shared/design/tf_semantics.md and multi_worker.md section 1.3), and
// the places where mirror deliberately differs (architecture.md 2.3, 3).

#include <catch2/catch.hpp>
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
