// SPDX-License-Identifier: Apache-2.0
// docs/guide.md, "Overlapping communication": the snippets between the // [name] markers are
// copied into the guide (tools/check_docs.py keeps the two equal). Exits 1 on a wrong value.
#include <mirror/mirror.hpp>
#include "check.hpp"
#include <cstddef>
#include <cstdio>
#include <algorithm>
#include <span>
#include <tuple>
#include <vector>

using guide::check;

int main() {
  using Strategy = mirror::Strategy<mirror::devices::Threads>;
  Strategy strategy{mirror::devices::Threads{.replicas = 4}};
  {
    std::vector<std::vector<float>> grads(4, std::vector<float>(1 << 16));
    std::vector<float> other(4);
    // [async]
    strategy.run([&](auto& ctx) {
      const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
      std::vector<float>& g = grads[r];
      std::fill(g.begin(), g.end(), static_cast<float>(r));
      // Started: g belongs to the collective until wait().
      mirror::Pending<mirror::Synced<std::span<float>>> mean =
          ctx.all_reduce_async(mirror::ReduceOp::mean, std::span<float>(g));
      other[r] = 2.0f * static_cast<float>(r);   // work that does not touch g
      mean.wait();                               // g holds the mean: 1.5 everywhere
    });
    // [/async]
    for (const auto& g : grads) check(g[0] == 1.5f && g[g.size() - 1] == 1.5f, "async mean");
    check(other[3] == 6.0f, "other work");
  }
  {
    std::vector<float> sums(4);
    // [buckets]
    // Four layers' gradients; backward produces the last layer's first.
    using Grads = std::tuple<std::vector<float>, std::vector<float>, std::vector<float>, std::vector<float>>;
    strategy.run([&](auto& ctx) {
      const float r = static_cast<float>(ctx.replica_id_in_sync_group());
      Grads grads{std::vector<float>(1000), std::vector<float>(10), std::vector<float>(5000), std::vector<float>(10)};
      auto buckets = ctx.gradient_buckets(mirror::ReduceOp::sum, grads, /*bucket_bytes=*/16 * 1024);
      auto backward = [&](auto& layer) {
        for (float& x : layer) x = r;                 // this layer's gradient is final...
      };
      backward(std::get<3>(grads));
      buckets.ready(3);                               // ...so its bucket may start
      backward(std::get<2>(grads));
      buckets.ready(2);
      backward(std::get<1>(grads));
      buckets.ready(1);
      backward(std::get<0>(grads));
      buckets.ready(0);
      buckets.finish();                               // every leaf: 0 + 1 + 2 + 3 = 6
      sums[static_cast<std::size_t>(r)] = std::get<0>(grads)[999] + std::get<3>(grads)[0];
    });
    // [/buckets]
    for (const float s : sums) check(s == 12.0f, "buckets");
  }
  {
    auto weights = strategy.make_variable(std::tuple{std::vector<float>(10, 1.0f), std::vector<float>(3, 1.0f)});
    // [sharded]
    // The sharded optimiser step with its gradient reduce-scattered during backward: each
    // replica keeps the momentum of its cut only, and the buckets leave it the reduced cuts.
    auto velocity = strategy.distribute_values_from_function([](const mirror::ValueContext& c) {
      return mirror::cut_for_replica(std::tuple{std::vector<float>(10), std::vector<float>(3)}, c);
    });
    using Velocity = std::tuple<std::vector<float>, std::vector<float>>;
    strategy.run([](auto& ctx, auto& w, Velocity& v) {
      std::vector<float> g0(10), g1(3);
      auto grads = std::tuple{std::span<float>(g0), std::span<float>(g1)};
      auto buckets = ctx.gradient_buckets(mirror::ReduceOp::mean, grads, 0, mirror::sharded);
      std::fill(g1.begin(), g1.end(), 4.0f);        // backward: the last layer first...
      buckets.ready(1);                             // ...whose cuts start reduce-scattering now
      std::fill(g0.begin(), g0.end(), 2.0f);
      buckets.ready(0);
      w.update_sharded([](std::span<float> param, std::span<const float> grad, std::span<float> vel) {
        for (std::size_t i = 0; i < param.size(); ++i) {
          vel[i] = 0.9f * vel[i] + grad[i];
          param[i] -= 0.25f * vel[i];
        }
      }, buckets, v);                               // finishes the buckets, steps, all-gathers
    }, weights, velocity);
    // [/sharded]
    for (const auto& c : Strategy::local_results(weights)) {
      check(std::get<0>(c)[9] == 0.5f && std::get<1>(c)[0] == 0.0f, "sharded buckets");
    }
  }
  return guide::result("overlap");
}
