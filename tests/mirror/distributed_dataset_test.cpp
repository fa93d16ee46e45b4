// SPDX-License-Identifier: Apache-2.0
// mirror/distributed_dataset.hpp and mirror/input_context.hpp: TF's split rule, ragged and empty
// batches, 2-D leaves, nests, prefetch, and distribute_datasets_from_function.

#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <numeric>
#include <ranges>
#include <stdexcept>
#include <vector>
#include <mirror/mirror.hpp>

using S = mirror::Strategy<mirror::devices::Threads>;

namespace {
struct Batch {
  BOOST_HANA_DEFINE_STRUCT(Batch, (mirror::matrix_view<const float>, images), (std::span<const int>, labels));
};
std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}
}  // namespace

TEST_CASE("the split rule: the first G mod R replicas get one more row, for every G <= 17 and R <= 8", "[input][split]") {
  for (int R = 1; R <= 8; ++R) {
    S s{{.replicas = R}};
    for (int G = 1; G <= 17; ++G) {
      CAPTURE(R, G);
      const std::vector<std::vector<int>> batches{iota(G)};
      int steps = 0;
      for (const auto& per_replica : s.distribute_dataset(batches)) {
        ++steps;
        int next = 0;
        for (int r = 0; r < R; ++r) {
          const auto& part = per_replica[static_cast<std::size_t>(r)];
          const int expected = G / R + (r < G % R ? 1 : 0);  // independent statement of TF's rule
          REQUIRE(int(part.size()) == expected);
          for (int x : part) REQUIRE(x == next++);  // contiguous, in order, no copy of the data
          if (!part.empty()) REQUIRE(part.data() == batches[0].data() + (next - int(part.size())));
        }
        REQUIRE(next == G);
      }
      REQUIRE(steps == 1);
    }
  }
}

TEST_CASE("a ragged last batch is split by the same rule; empty replicas get empty views", "[input][split]") {
  // docs/guide.md#input: 4 elements over 3 replicas: 2, 1, 1. TF issue 45594: every remainder.
  S s{{.replicas = 3}};
  const std::vector<std::vector<float>> batches{std::vector<float>(9, 1.0f), std::vector<float>(4, 2.0f),
                                                std::vector<float>(1, 3.0f)};
  std::vector<std::vector<std::size_t>> sizes;
  for (const auto& per_replica : s.distribute_dataset(batches)) {
    sizes.push_back({});
    for (const auto& part : per_replica) sizes.back().push_back(part.size());
  }
  REQUIRE(sizes == std::vector<std::vector<std::size_t>>{{3, 3, 3}, {2, 1, 1}, {1, 0, 0}});
}

TEST_CASE("iteration ends at the end of the range or at a batch with no rows", "[input]") {
  S s{{.replicas = 2}};
  const std::vector<std::vector<int>> batches{iota(4), {}, iota(4)};
  int steps = 0;
  for (const auto& p : s.distribute_dataset(batches)) {
    (void)p;
    ++steps;
  }
  REQUIRE(steps == 1);
  const std::vector<std::vector<int>> none;
  REQUIRE(s.distribute_dataset(none).begin() == std::default_sentinel);
}

TEST_CASE("2-D leaves split by rows; nests keep their structure", "[input][matrix]") {
  S s{{.replicas = 2}};
  std::vector<float> pixels(5 * 3);
  std::iota(pixels.begin(), pixels.end(), 0.0f);
  const std::vector<int> labels = iota(5, 100);
  const std::vector<Batch> batches{Batch{{pixels, 3}, labels}};
  for (const auto& per_replica : s.distribute_dataset(batches)) {
    const Batch& a = per_replica[0];
    const Batch& b = per_replica[1];
    REQUIRE((a.images.rows() == 3 && b.images.rows() == 2));
    REQUIRE(a.images(2, 1) == 7.0f);
    REQUIRE(b.images(0, 0) == 9.0f);
    REQUIRE(std::vector<int>(b.labels.begin(), b.labels.end()) == std::vector<int>{103, 104});
  }
  // owning leaves in a tuple become views
  using Owning = std::tuple<mirror::matrix<double>, std::vector<int>>;
  const std::vector<Owning> owning{{mirror::matrix<double>{std::vector<double>(8, 1.5), 2}, iota(4)}};
  for (const auto& per_replica : s.distribute_dataset(owning)) {
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(per_replica[0])>,
                                 std::tuple<mirror::matrix_view<const double>, std::span<const int>>>);
    REQUIRE(std::get<0>(per_replica[1]).rows() == 2);
    REQUIRE(std::get<1>(per_replica[1])[0] == 2);
  }
}

TEST_CASE("leaves of one batch with different row counts are a shape_error", "[input][errors]") {
  S s{{.replicas = 2}};
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> bad{{iota(4), iota(3)}};
  REQUIRE_THROWS_MATCHES([&] { for (const auto& p : s.distribute_dataset(bad)) (void)p; }(), mirror::shape_error, mirror::test::what(Catch::Contains("has 3 rows but leaf 0 has 4")));
}

TEST_CASE("a matrix whose element count is not a multiple of its columns is a shape_error", "[input][matrix][errors]") {
  // Issue 33: 10 floats in 3 columns silently lost the 10th element. Rejected where it is first
  // used as a batch, naming both sizes; a matrix with no columns cannot hold elements either.
  S s{{.replicas = 2}};
  auto split_all = [&](const auto& batches) {
    for (const auto& p : s.distribute_dataset(batches)) (void)p;
  };
  const std::vector<mirror::matrix<float>> ten{{std::vector<float>(10, 1.0f), 3}};
  REQUIRE_THROWS_AS(split_all(ten), mirror::shape_error);
  REQUIRE_THROWS_MATCHES(split_all(ten), mirror::shape_error, mirror::test::what(Catch::Contains("10 elements") && Catch::Contains("3 columns")));
  const std::vector<float> pixels(10, 2.0f);
  const std::vector<std::tuple<std::vector<int>, mirror::matrix_view<const float>>> views{
      {iota(3), mirror::matrix_view<const float>{pixels, 3}}};
  REQUIRE_THROWS_MATCHES(split_all(views), mirror::shape_error, mirror::test::what(Catch::Contains("leaf 1") && Catch::Contains("10 elements")));
  const std::vector<mirror::matrix<float>> no_columns{{std::vector<float>(4, 1.0f), 0}};
  REQUIRE_THROWS_AS(split_all(no_columns), mirror::shape_error);
  // Whole rows still split as before: 9 floats in 3 columns are 3 rows, 2 and 1.
  const std::vector<mirror::matrix<float>> nine{{std::vector<float>(9, 1.0f), 3}};
  for (const auto& p : s.distribute_dataset(nine)) REQUIRE((p[0].rows() == 2 && p[1].rows() == 1));
}

TEST_CASE("prefetch gives the same batches, also from a lazy range, and passes its errors on", "[input][prefetch]") {
  S s{{.replicas = 3}};
  auto lazy = std::views::iota(0, 6) | std::views::transform([](int i) { return iota(i + 1, i * 10); });
  std::vector<std::vector<int>> plain, fetched;
  for (const auto& p : s.distribute_dataset(lazy)) plain.emplace_back(p[0].begin(), p[0].end());
  for (const auto& p : s.distribute_dataset(lazy, {.prefetch = 2})) fetched.emplace_back(p[0].begin(), p[0].end());
  for (const auto& p : s.distribute_dataset(lazy, {.prefetch = 2})) {  // stop early: the producer stops too
    (void)p;
    break;
  }
  REQUIRE(plain.size() == 6);
  // element i has i + 1 rows; replica 0 takes the first ceil((i + 1) / 3)
  for (int i = 0; i < 6; ++i) REQUIRE(plain[static_cast<std::size_t>(i)] == iota((i + 3) / 3, i * 10));
  REQUIRE(fetched == plain);
  auto failing = std::views::iota(0, 5) | std::views::transform([](int i) {
                   if (i == 3) throw std::runtime_error("reader failed");
                   return iota(2);
                 });
  int steps = 0;
  REQUIRE_THROWS_MATCHES([&] { for (const auto& p : s.distribute_dataset(failing, {.prefetch = 1})) { (void)p; ++steps; } }(), std::runtime_error, mirror::test::what("reader failed"));
  REQUIRE(steps == 3);
  REQUIRE_THROWS_AS(s.distribute_dataset(lazy, {.prefetch = -1}), std::invalid_argument);
}

TEST_CASE("distribute_datasets_from_function: one call, replicas dequeue in order, ragged end", "[input][from_function]") {
  S s{{.replicas = 3}};
  int calls = 0;
  auto dataset = s.distribute_datasets_from_function([&](const mirror::InputContext& ctx) {
    ++calls;
    REQUIRE(ctx == mirror::InputContext{1, 0, 3});
    const int per_replica = ctx.get_per_replica_batch_size(6);
    std::vector<std::vector<int>> batches;
    for (int i = 0; i < 7; ++i) batches.push_back(std::vector<int>(static_cast<std::size_t>(per_replica), i));
    return batches;
  });
  REQUIRE(calls == 1);
  std::vector<std::vector<int>> firsts;
  for (const auto& per_replica : dataset) {
    firsts.push_back({});
    for (const auto& b : per_replica) firsts.back().push_back(b.empty() ? -1 : b[0]);
  }
  REQUIRE(firsts == std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}, {6, -1, -1}});
}

TEST_CASE("InputContext::get_per_replica_batch_size", "[input][input_context]") {
  const mirror::InputContext ctx{1, 0, 4};
  REQUIRE(ctx.get_per_replica_batch_size(64) == 16);
  REQUIRE_THROWS_MATCHES(ctx.get_per_replica_batch_size(10), std::invalid_argument, mirror::test::what(Catch::Contains("not divisible by num_replicas_in_sync = 4")));
  REQUIRE(mirror::InputContext{} == mirror::InputContext{1, 0, 1});
}

TEST_CASE("a training step over distributed batches reduces the loss over the true element count", "[input][axis0]") {
  S s{{.replicas = 4}};
  const std::vector<std::vector<float>> batches{std::vector<float>(10, 1.0f), std::vector<float>(3, 3.0f)};
  std::vector<float> means;
  for (const auto& per_replica : s.distribute_dataset(batches)) {
    const auto losses = s.run([](std::span<const float> rows) { return std::vector<float>(rows.begin(), rows.end()); },
                              per_replica);
    means.push_back(s.reduce(mirror::ReduceOp::mean, losses, mirror::axis0));
  }
  REQUIRE(means == std::vector<float>{1.0f, 3.0f});  // the last step has an empty replica
}
