// SPDX-License-Identifier: Apache-2.0
// mirror/sync_on_read_variable.hpp: TF's ON_READ rules (docs/guide.md#variables).

#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <vector>
#include <mirror/mirror.hpp>

using mirror::VariableAggregation;
using S = mirror::Strategy<mirror::devices::Threads>;

TEST_CASE("replicas write their own copy; a cross-replica read aggregates (values_test numbers)", "[variables][sync_on_read]") {
  // testSaveAndRestoreOnRead: replicas hold 4 and 3 -> SUM reads 7, MEAN 3.5
  S s{{.replicas = 2}};
  auto sum = s.make_sync_on_read_variable(0.0, VariableAggregation::sum);
  auto mean = s.make_sync_on_read_variable(0.0, VariableAggregation::mean);
  auto first = s.make_sync_on_read_variable(0.0, VariableAggregation::only_first_replica);
  const auto local_reads = s.run(
      [](auto& ctx, auto& a, auto& b, auto& c) {
        const double x = ctx.replica_id_in_sync_group() == 0 ? 4.0 : 3.0;
        a.assign(x);
        b.assign(x);
        c.assign(x);
        return a.value();  // replica context reads the local copy
      },
      sum, mean, first);
  REQUIRE(std::vector<double>(local_reads.begin(), local_reads.end()) == std::vector<double>{4.0, 3.0});
  REQUIRE(sum.value() == 7.0);
  REQUIRE(mean.value() == 3.5);
  REQUIRE(first.value() == 4.0);
  REQUIRE(std::vector<double>(S::local_results(sum).begin(), S::local_results(sum).end()) == std::vector<double>{4.0, 3.0});
}

TEST_CASE("cross-replica assign of a sum variable stores v / N in each copy", "[variables][sync_on_read]") {
  // restore of a normal variable saved as 2.0: SUM -> 1.0 per copy, MEAN -> 2.0
  S s{{.replicas = 2}};
  auto sum = s.make_sync_on_read_variable(std::vector<float>{0, 0}, VariableAggregation::sum);
  auto mean = s.make_sync_on_read_variable(std::vector<float>{0, 0}, VariableAggregation::mean);
  sum.assign({2, 4});
  mean.assign({2, 4});
  for (const auto& c : S::local_results(sum)) REQUIRE(c == std::vector<float>{1, 2});
  for (const auto& c : S::local_results(mean)) REQUIRE(c == std::vector<float>{2, 4});
  REQUIRE(sum.value() == std::vector<float>{2, 4});
  mean.assign_add({1, 1});
  REQUIRE(mean.value() == std::vector<float>{3, 5});
}

TEST_CASE("cross-replica assign divides by N for sum only; every other aggregation stores v in each copy",
          "[variables][sync_on_read]") {
  // TF's rule: only a SUM variable's copies hold v / N (so that its read gives v).
  S s{{.replicas = 4}};
  for (const auto aggregation : {VariableAggregation::none, VariableAggregation::mean,
                                 VariableAggregation::only_first_replica, VariableAggregation::sum}) {
    CAPTURE(static_cast<int>(aggregation));
    auto v = s.make_sync_on_read_variable(std::vector<double>{0, 0}, aggregation);
    v.assign({8, -2});
    const std::vector<double> each =
        aggregation == VariableAggregation::sum ? std::vector<double>{2, -0.5} : std::vector<double>{8, -2};
    for (const auto& c : S::local_results(v)) REQUIRE(c == each);
    if (aggregation != VariableAggregation::none) REQUIRE(v.value() == std::vector<double>{8, -2});
  }
}

TEST_CASE("sync-on-read errors follow TF", "[variables][sync_on_read][errors]") {
  S s{{.replicas = 3}};
  auto none = s.make_sync_on_read_variable(1, VariableAggregation::none);
  REQUIRE_THROWS_AS(none.value(), mirror::aggregation_error);
  auto sum = s.make_sync_on_read_variable(1, VariableAggregation::sum);
  REQUIRE_THROWS_MATCHES(sum.assign_add(1), mirror::aggregation_error, mirror::test::what(Catch::Contains("assign_add") && Catch::Contains("sum")));
  REQUIRE(sum.value() == 3);  // unchanged
  auto metric = s.make_sync_on_read_variable(std::vector<int>{0, 0}, VariableAggregation::sum);
  REQUIRE_THROWS_AS(metric.assign({1}), mirror::shape_error);
}

TEST_CASE("a metric accumulated over steps (replica-local writes, one aggregated read)", "[variables][sync_on_read]") {
  S s{{.replicas = 4}};
  auto correct = s.make_sync_on_read_variable(0L, VariableAggregation::sum);
  for (int step = 0; step < 10; ++step) {
    s.run([&](auto& ctx, auto& c) { c.assign_add(long(ctx.replica_id_in_sync_group() + step)); }, correct);
  }
  // sum over steps and replicas of (r + step) = 10 * (0+1+2+3) + 4 * 45
  REQUIRE(correct.value() == 60 + 180);
}
