// SPDX-License-Identifier: Apache-2.0
// A program written only against the public contract's input and variables (docs/guide.md#input,
// docs/guide.md#variables), built outside the tree with `pkg-config --cflags --libs mirror`. Every
// result is checked against a value computed here independently; exit code 0 means all held.
#include <mirror/mirror.hpp>

#include <cstdio>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace {
int failures = 0, checks = 0;
void check(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

struct Params {
  BOOST_HANA_DEFINE_STRUCT(Params, (std::vector<float>, w), (float, b));
};
}  // namespace

int main() {
  using mirror::VariableAggregation;
  mirror::Strategy<mirror::devices::Threads> s{mirror::devices::Threads{.replicas = 3}};

  // --- 2.5 MirroredVariable: replica-context updates aggregated, applied to every copy ---
  auto params = s.make_variable(Params{{1, 1}, 0}, VariableAggregation::sum);
  s.run([](auto& ctx, auto& p) { p.assign_add(Params{{1, 2}, float(ctx.replica_id_in_sync_group())}); }, params);
  for (const auto& c : s.local_results(params)) check(c.w == std::vector<float>{4, 7} && c.b == 3, "sum assign_add");
  auto m = s.make_variable(10.0, VariableAggregation::mean);
  s.run([](auto& ctx, auto& v) { v.assign(double(ctx.replica_id_in_sync_group())); }, m);
  check(m.value() == 1.0, "mean assign");
  auto first = s.make_variable(0, VariableAggregation::only_first_replica);
  s.run([](auto& ctx, auto& v) { v.assign_sub(ctx.replica_id_in_sync_group() + 5); }, first);
  check(first.value() == -5, "only_first_replica assign_sub");
  first.assign_add(2);  // cross-replica: every copy
  for (int c : s.local_results(first)) check(c == -3, "cross-replica assign_add");

  auto none = s.make_variable(1.0f);
  bool rejected = false;
  try {
    s.run([](auto&, auto& v) { v.assign_add(1.0f); }, none);
  } catch (const mirror::aggregation_error&) {
    rejected = true;
  }
  check(rejected, "none rejects replica-context updates");
  for (float c : s.local_results(none)) check(c == 1.0f, "nothing half-applied");

  // --- 2.5 SyncOnReadVariable: local writes, aggregated cross-replica read ---
  auto count = s.make_sync_on_read_variable(0, VariableAggregation::sum);
  s.run([](auto& ctx, auto& c) { c.assign_add(ctx.replica_id_in_sync_group() + 1); }, count);
  check(count.value() == 6, "sync-on-read sum read");
  count.assign(9);  // sum: 9 / 3 per copy
  for (int c : s.local_results(count)) check(c == 3, "sync-on-read sum assign");
  bool read_error = false;
  try {
    (void)s.make_sync_on_read_variable(1, VariableAggregation::none).value();
  } catch (const mirror::aggregation_error&) {
    read_error = true;
  }
  check(read_error, "sync-on-read none read");

  // --- 2.4 distribute_dataset: first G mod R replicas get one more; ragged; empty ---
  std::vector<std::vector<int>> batches{std::vector<int>(7), std::vector<int>(4), std::vector<int>(1)};
  for (auto& b : batches) std::iota(b.begin(), b.end(), 0);
  const std::vector<std::vector<std::size_t>> expected{{3, 2, 2}, {2, 1, 1}, {1, 0, 0}};
  std::size_t step = 0;
  for (const auto& per_replica : s.distribute_dataset(batches)) {
    for (std::size_t r = 0; r < 3; ++r) {
      check(step < expected.size() && per_replica[r].size() == expected[step][r], "split sizes");
    }
    const auto sums = s.run([](auto& ctx, std::span<const int> rows) {
      return ctx.all_reduce(mirror::ReduceOp::sum, std::accumulate(rows.begin(), rows.end(), 0));
    }, per_replica);
    const int total = std::accumulate(batches[step].begin(), batches[step].end(), 0);
    check(sums.primary() == total, "every row seen once");
    ++step;
  }
  check(step == 3, "three steps");

  // --- 2.4 distribute_datasets_from_function + InputContext ---
  auto ds = s.distribute_datasets_from_function([](const mirror::InputContext& ctx) {
    const int per_replica = ctx.get_per_replica_batch_size(6);
    return std::vector<std::vector<float>>(4, std::vector<float>(static_cast<std::size_t>(per_replica), 1.0f));
  });
  int steps = 0, empty = 0;
  for (const auto& per_replica : ds) {
    ++steps;
    for (const auto& b : per_replica) empty += b.empty() ? 1 : 0;
  }
  check(steps == 2 && empty == 2, "from_function steps and ragged end");
  bool divisible_error = false;
  try {
    (void)mirror::InputContext{1, 0, 4}.get_per_replica_batch_size(6);
  } catch (const std::invalid_argument&) {
    divisible_error = true;
  }
  check(divisible_error, "get_per_replica_batch_size");

  std::printf("contract_variables_input: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
