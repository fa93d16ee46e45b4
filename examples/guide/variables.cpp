// SPDX-License-Identifier: Apache-2.0
// docs/guide.md, "Variables" and "Checkpoints": the snippets between the // [name] markers are
// copied into the guide (tools/check_docs.py keeps the two equal). Exits 1 on a wrong value.
#include <mirror/mirror.hpp>
#include "check.hpp"
#include <boost/hana/define_struct.hpp>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <vector>

// [model]
struct Params {
  BOOST_HANA_DEFINE_STRUCT(Params, (std::vector<float>, w), (std::vector<float>, b));
};
// [/model]

using guide::check;

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};

  // [variables]
  auto params = strategy.make_variable(Params{std::vector<float>(3, 1.0f), {0.0f}},
                                       mirror::VariableAggregation::mean);   // MirroredVariable<Params>
  auto seen = strategy.make_sync_on_read_variable(0L, mirror::VariableAggregation::sum);

  strategy.run([](auto& ctx, auto& p, auto& n) {
    const float r = static_cast<float>(ctx.replica_id_in_sync_group());
    Params step{std::vector<float>(3, 0.25f * (r + 1)), {r}};   // differs per replica
    p.assign_sub(step);        // the mean of the replicas' steps, applied once to every copy
    n.assign_add(32L);         // this replica's copy only
  }, params, seen);

  long rows = seen.value();    // cross-replica read: the sum of the copies, 64
  // [/variables]
  check(rows == 64, "sync-on-read sum");
  check(params.value().w[0] == 0.625f && params[1].b[0] == -0.5f, "mirrored mean update");

  // [update]
  // An optimiser step: all-reduce the gradients, then apply the same step to every copy.
  strategy.run([](auto& ctx, auto& p) {
    Params grad{std::vector<float>(3, 1.0f), {2.0f}};
    auto g = ctx.all_reduce(mirror::ReduceOp::mean, grad);   // Synced<Params>
    p.update([](Params& copy, const Params& mean_grad) {
      for (std::size_t i = 0; i < copy.w.size(); ++i) copy.w[i] -= 0.5f * mean_grad.w[i];
      copy.b[0] -= 0.5f * mean_grad.b[0];
    }, g);                      // no communication: every copy gets the same step
  }, params);
  // [/update]
  check(params[0].w == params[1].w && params[0].w[2] == 0.125f, "update");

  // [sharded]
  // The same step, sharded (ZeRO stage 1): each replica keeps 1/N of the momentum, steps only
  // its cut of the parameters, and the cuts are all-gathered into every copy.
  auto velocity = strategy.distribute_values_from_function([](const mirror::ValueContext& c) {
    return mirror::cut_for_replica(Params{std::vector<float>(3), {0.0f}}, c);   // w: 2 or 1, b: 1 or 0
  });
  strategy.run([](auto&, auto& p, Params& v) {
    std::vector<float> gw(3, 1.0f), gb{2.0f};            // this replica's gradient
    p.update_sharded([](std::span<float> param, std::span<const float> grad, std::span<float> vel) {
      for (std::size_t i = 0; i < param.size(); ++i) {
        vel[i] = 0.9f * vel[i] + grad[i];
        param[i] -= 0.25f * vel[i];
      }
    }, mirror::ReduceOp::mean, std::tuple{std::span<float>(gw), std::span<float>(gb)}, v);
  }, params, velocity);
  // [/sharded]
  check(params[0].w == params[1].w && params[1].w[2] == -0.125f && params[0].b[0] == -2.0f, "update_sharded");
  check(velocity[0].w.size() == 2 && velocity[1].w.size() == 1 && velocity[1].b.empty(), "cut_for_replica");

  const std::string path = (std::filesystem::temp_directory_path() / "mirror_guide_variables.ckpt").string();
  // [checkpoint]
  mirror::save(strategy, path, params, seen);      // the chief writes path.tmp, then renames it
  auto params2 = strategy.make_variable(Params{std::vector<float>(3), {0.0f}},
                                        mirror::VariableAggregation::mean);
  auto seen2 = strategy.make_sync_on_read_variable(0L, mirror::VariableAggregation::sum);
  mirror::restore(strategy, path, params2, seen2); // same types and shapes, same order
  // [/checkpoint]
  check(params2.value().w == params.value().w && seen2.value() == 64, "restore");
  std::filesystem::remove(path);

  return guide::result("variables");
}
