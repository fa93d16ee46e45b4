// SPDX-License-Identifier: Apache-2.0
// docs/guide.md, "Run, values and collectives": the snippets between the // [name] markers
// are copied into the guide (tools/check_docs.py keeps the two equal). Exits 1 on a wrong value.
#include <mirror/mirror.hpp>
#include "check.hpp"
#include <cstdio>
#include <span>
#include <tuple>
#include <vector>

using guide::check;

int main() {
  // [strategy]
  using Strategy = mirror::Strategy<mirror::devices::Threads>;   // default ops for Threads
  Strategy strategy{mirror::devices::Threads{.replicas = 4}};
  // [/strategy]

  {
    // [run]
    // fn runs once per replica, concurrently; it may take the replica context first.
    mirror::PerReplica<int> ids = strategy.run([](auto& ctx) {
      return ctx.replica_id_in_sync_group();        // a plain value: one per replica
    });
    mirror::Mirrored<int> total = strategy.run([](auto& ctx) {
      return ctx.all_reduce(mirror::ReduceOp::sum, ctx.replica_id_in_sync_group());  // Synced<int>
    });
    int sum = strategy.reduce(mirror::ReduceOp::sum, ids);   // 0 + 1 + 2 + 3 = 6
    // [/run]
    check(ids.size() == 4 && ids[2] == 2, "ids");
    check(total.size() == 4 && total.primary() == 6 && total[3] == 6, "total");
    check(sum == 6, "sum");
  }
  {
    // [arguments]
    std::vector<float> weights(8, 0.5f);                        // shared, read-only in fn
    mirror::PerReplica<float> scale(std::vector<float>{1, 2, 3, 4});  // component r for replica r
    auto [dots, norm] = strategy.run(
        [](auto& ctx, const std::vector<float>& w, float s) {
          float dot = 0;
          for (float x : w) dot += s * x;                       // 4 * s on replica r
          return std::tuple{dot, ctx.all_reduce(mirror::ReduceOp::max, dot)};
        },
        weights, scale);                                       // PerReplica<float>, Mirrored<float>
    // [/arguments]
    check(dots[0] == 4.0f && dots[3] == 16.0f, "dots");
    check(norm.primary() == 16.0f, "norm");
  }
  {
    // [in_place]
    // A std::span leaf is reduced in place, in every replica's own buffer: no allocation.
    std::vector<std::vector<float>> grads(4, std::vector<float>(1 << 20));
    strategy.run([&grads](auto& ctx) {
      std::vector<float>& mine = grads[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
      std::fill(mine.begin(), mine.end(), 1.0f);
      ctx.all_reduce(mirror::ReduceOp::mean, std::span<float>(mine));  // every buffer: the mean
    });
    // [/in_place]
    check(grads[0][0] == 1.0f && grads[3][(1 << 20) - 1] == 1.0f, "in place mean");
  }
  {
    // [broadcast]
    auto seeds = strategy.run([](auto& ctx) {
      unsigned seed = 1234u + static_cast<unsigned>(ctx.replica_id_in_sync_group());
      return ctx.broadcast(seed, /*from=*/0);               // every replica: replica 0's seed
    });
    mirror::Mirrored<std::vector<int>> table = strategy.broadcast(std::vector<int>{1, 2, 3});
    // [/broadcast]
    check(seeds[3] == 1234u, "broadcast seed");
    check(table.size() == 4 && table[2] == std::vector<int>({1, 2, 3}), "strategy.broadcast");
  }
  {
    // [merge_call]
    auto largest = strategy.run([](auto& ctx) {
      float loss = 0.25f * static_cast<float>(ctx.replica_id_in_sync_group());
      // Runs once, in cross-replica context, with every replica's loss gathered.
      return ctx.merge_call([](Strategy& s, const mirror::PerReplica<float>& losses) {
        return s.reduce(mirror::ReduceOp::max, losses);
      }, loss);                                              // Synced<float> on every replica
    });
    // [/merge_call]
    check(largest.primary() == 0.75f && largest[1] == 0.75f, "merge_call");
  }
  {
    // [axis0]
    // Replicas hold 3, 3, 2 and 2 rows of a 10-row batch: reduce(mean, v, axis0) divides by 10.
    auto losses = strategy.run([](auto& ctx) {
      const std::size_t rows = ctx.replica_id_in_sync_group() < 2 ? 3 : 2;
      return std::vector<float>(rows, 1.0f + static_cast<float>(ctx.replica_id_in_sync_group()));
    });
    float mean_loss = strategy.reduce(mirror::ReduceOp::mean, losses, mirror::axis0);
    // [/axis0]
    check(mean_loss == (3 * 1.0f + 3 * 2.0f + 2 * 3.0f + 2 * 4.0f) / 10.0f, "axis0 mean");
  }
  {
    // [all_gather]
    // Replica r holds r + 1 rows; every replica gets all 10, in replica order.
    auto everyone = strategy.run([](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<int> mine(static_cast<std::size_t>(r + 1), r);
      return ctx.all_gather(mine, mirror::axis0);     // Synced<std::vector<int>>: 0 1 1 2 2 2 3 3 3 3
    });
    auto ids = strategy.run([](auto& ctx) {
      return ctx.all_gather(ctx.replica_id_in_sync_group(), mirror::axis0);  // a scalar: 0 1 2 3
    });
    // Outside run: the components of a PerReplica, concatenated.
    mirror::PerReplica<std::vector<int>> rows =
        strategy.distribute_values_from_function([](const mirror::ValueContext& c) {
          return std::vector<int>(2, 10 * c.replica_id_in_sync_group);
        });
    std::vector<int> table = strategy.gather(rows, mirror::axis0);            // 0 0 10 10 20 20 30 30
    // [/all_gather]
    check(everyone.primary() == std::vector<int>({0, 1, 1, 2, 2, 2, 3, 3, 3, 3}) && everyone[3] == everyone[0],
          "all_gather");
    check(ids[2] == std::vector<int>({0, 1, 2, 3}), "all_gather of scalars");
    check(table == std::vector<int>({0, 0, 10, 10, 20, 20, 30, 30}), "gather");
  }
  {
    // [reduce_scatter]
    // 10 elements over 4 replicas: cuts of 3, 3, 2 and 2. Replica r gets the sum of cut r, in
    // place in its own buffer; the rest of the buffer is left as it was.
    std::vector<std::vector<float>> grads(4, std::vector<float>(10, 1.0f));
    auto cuts = strategy.run([&grads](auto& ctx) {
      std::vector<float>& mine = grads[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
      std::span<float> cut = ctx.reduce_scatter(mirror::ReduceOp::sum, std::span<float>(mine));
      return cut.size();                              // 3, 3, 2, 2; every element of the cut: 4
    });
    // [/reduce_scatter]
    check(cuts[0] == 3 && cuts[3] == 2, "reduce_scatter cut sizes");
    check(grads[1][3] == 4.0f && grads[1][5] == 4.0f && grads[1][6] == 1.0f && grads[3][9] == 4.0f &&
              grads[3][0] == 1.0f,
          "reduce_scatter in place");
  }
  return guide::result("run_and_reduce");
}
