// SPDX-License-Identifier: Apache-2.0
// docs/guide.md, "Input": the snippets between the // [name] markers are copied into the guide
// (tools/check_docs.py keeps the two equal). Exits 1 on a wrong value.
#include <mirror/mirror.hpp>
#include "check.hpp"
#include <boost/hana/define_struct.hpp>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

// [batch]
struct Batch {                   // a batch is a nest whose leaves have a leading (row) dimension
  BOOST_HANA_DEFINE_STRUCT(Batch, (mirror::matrix_view<const float>, images),
                                  (std::span<const std::int32_t>, labels));
};
// [/batch]

using guide::check;

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 3}};

  // [distribute_dataset]
  // 10 images of 4 pixels, cut into global batches of 4 rows: 4, 4 and a ragged last batch of 2.
  std::vector<float> pixels(10 * 4);
  std::vector<std::int32_t> labels(10);
  for (int i = 0; i < 10; ++i) labels[static_cast<std::size_t>(i)] = i;
  const mirror::matrix_view<const float> images{pixels, 4};
  std::vector<Batch> global_batches;
  for (std::size_t first = 0; first < 10; first += 4) {
    const std::size_t rows = std::min<std::size_t>(4, 10 - first);
    global_batches.push_back(Batch{images.subrows(first, rows),
                                   std::span<const std::int32_t>(labels).subspan(first, rows)});
  }
  std::vector<std::vector<std::size_t>> rows_per_step;
  for (const auto& per_replica : strategy.distribute_dataset(global_batches)) {
    auto rows = strategy.run([](const Batch& b) { return b.labels.size(); }, per_replica);
    rows_per_step.push_back({rows[0], rows[1], rows[2]});   // {2,1,1}, {2,1,1}, {1,1,0}
  }
  // [/distribute_dataset]
  check(rows_per_step == std::vector<std::vector<std::size_t>>{{2, 1, 1}, {2, 1, 1}, {1, 1, 0}}, "split rule");

  // [from_function]
  // The function batches per replica and shards itself; each step every replica dequeues one.
  auto dataset = strategy.distribute_datasets_from_function([](const mirror::InputContext& ctx) {
    const int per_replica = ctx.get_per_replica_batch_size(6);   // 6 / 3 = 2
    std::vector<std::vector<int>> batches;
    for (int first = 0; first < 12; first += per_replica) batches.push_back({first, first + 1});
    return batches;                                               // 6 batches: 2 steps of 3
  });
  int steps = 0, total = 0;
  for (const auto& per_replica : dataset) {
    ++steps;
    auto sums = strategy.run([](const std::vector<int>& b) { return b[0] + b[1]; }, per_replica);
    total += strategy.reduce(mirror::ReduceOp::sum, sums);
  }
  // [/from_function]
  check(steps == 2 && total == 66, "from_function");

  return guide::result("input");
}
