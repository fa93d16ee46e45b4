// SPDX-License-Identifier: Apache-2.0
// mirror/mirrored_variable.hpp: TF's ON_WRITE rules (docs/guide.md#variables), with mirror's
// fix for aggregation none, and nothing half-applied on a rejected update.

#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include "support/reference.hpp"
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::ReduceOp;
using mirror::VariableAggregation;
using S = mirror::Strategy<mirror::devices::Threads>;

namespace {
struct Params {
  BOOST_HANA_DEFINE_STRUCT(Params, (std::vector<float>, w), (std::array<double, 2>, b), (float, scale));
};
template <class V>
void require_all_copies(const V& v, const typename V::value_type& expected) {
  for (const auto& c : S::local_results(v)) REQUIRE(c == expected);
}
}  // namespace

TEST_CASE("every copy starts as the initial value", "[variables][mirrored]") {
  S s{{.replicas = 3}};
  auto v = s.make_variable(std::vector<int>{1, 2, 3});
  REQUIRE(v.size() == 3);
  require_all_copies(v, {1, 2, 3});
  REQUIRE(v.aggregation() == VariableAggregation::none);
}

TEST_CASE("replica-context updates are combined with the aggregation and applied to every copy", "[variables][mirrored]") {
  S s{{.replicas = 4}};
  // replica r adds r + 1: sum 10, mean 2.5, only_first 1
  const std::pair<VariableAggregation, float> cases[] = {
      {VariableAggregation::sum, 10.0f}, {VariableAggregation::mean, 2.5f}, {VariableAggregation::only_first_replica, 1.0f}};
  for (const auto& [agg, delta] : cases) {
    CAPTURE(mirror::to_string(agg));
    auto v = s.make_variable(1.0f, agg);
    s.run([](auto& ctx, auto& var) { var.assign_add(float(ctx.replica_id_in_sync_group() + 1)); }, v);
    require_all_copies(v, 1.0f + delta);
    s.run([](auto& ctx, auto& var) { var.assign_sub(float(ctx.replica_id_in_sync_group() + 1)); }, v);
    require_all_copies(v, 1.0f);
    s.run([](auto& ctx, auto& var) { var.assign(float(ctx.replica_id_in_sync_group() + 1)); }, v);
    require_all_copies(v, delta);
  }
}

TEST_CASE("a nest variable (a model's parameters) is updated with one fused all-reduce", "[variables][mirrored]") {
  S s{{.replicas = 3}};
  auto v = s.make_variable(Params{{1, 1, 1}, {0, 0}, 2.0f}, VariableAggregation::mean);
  const auto seen = s.run(
      [](auto& ctx, auto& p) {
        const float r = float(ctx.replica_id_in_sync_group());
        p.assign_add(Params{{r, 2 * r, 3 * r}, {r, -r}, 0.0f});
        return p.value().w;  // every replica sees the updated copy at once
      },
      v);
  const Params expected{{2, 3, 4}, {1, -1}, 2.0f};
  for (const auto& c : S::local_results(v)) {
    REQUIRE(c.w == expected.w);
    REQUIRE(c.b == expected.b);
    REQUIRE(c.scale == expected.scale);
  }
  for (const auto& w : seen) REQUIRE(w == expected.w);
}

TEST_CASE("aggregation none rejects replica-context updates on every replica and changes nothing", "[variables][mirrored][errors]") {
  // TF (>= 2.4) silently updates only the local copy, which breaks the mirror invariant.
  S s{{.replicas = 3}};
  auto v = s.make_variable(std::vector<float>{5, 5});
  REQUIRE_THROWS_MATCHES(s.run([](auto& ctx, auto& var) { var.assign_add({float(ctx.replica_id_in_sync_group()), 0}); }, v), mirror::aggregation_error, mirror::test::what(Catch::Contains("aggregation is none") && Catch::Contains("VariableAggregation::sum")));
  require_all_copies(v, {5, 5});
  // cross-replica updates are fine with none
  v.assign_add({1, 2});
  require_all_copies(v, {6, 7});
}

TEST_CASE("an update of the wrong shape is a shape_error and changes nothing", "[variables][mirrored][errors]") {
  S s{{.replicas = 2}};
  auto v = s.make_variable(std::vector<float>{1, 2}, VariableAggregation::sum);
  REQUIRE_THROWS_AS(s.run([](auto&, auto& var) { var.assign_add({1, 2, 3}); }, v), mirror::shape_error);
  require_all_copies(v, {1, 2});
  REQUIRE_THROWS_AS(v.assign(std::vector<float>{1}), mirror::shape_error);
  require_all_copies(v, {1, 2});
}

TEST_CASE("mean aggregation needs floating-point leaves (TF's creation rule)", "[variables][mirrored][errors]") {
  S s{{.replicas = 2}};
  REQUIRE_THROWS_AS(s.make_variable(std::vector<int>{1}, VariableAggregation::mean), mirror::aggregation_error);
  REQUIRE_NOTHROW(s.make_variable(std::vector<int>{1}, VariableAggregation::sum));
}

TEST_CASE("update(fn, synced...) applies one update to every copy without communicating", "[variables][mirrored]") {
  S s{{.replicas = 4}};
  struct State {
    BOOST_HANA_DEFINE_STRUCT(State, (std::vector<float>, w), (std::vector<float>, velocity));
  };
  auto state = s.make_variable(State{{1, 1}, {0, 0}});
  for (int step = 0; step < 3; ++step) {
    s.run(
        [](auto& ctx, auto& st) {
          std::vector<float> grad{float(ctx.replica_id_in_sync_group()), 1.0f};
          const auto g = ctx.all_reduce(ReduceOp::mean, std::span<float>(grad));
          st.update(
              [](State& x, std::span<float> mean_grad) {
                for (std::size_t i = 0; i < 2; ++i) {
                  x.velocity[i] = 0.5f * x.velocity[i] + mean_grad[i];
                  x.w[i] -= 0.1f * x.velocity[i];
                }
              },
              g);
        },
        state);
  }
  // serial reference: mean grad (1.5, 1)
  std::vector<float> w{1, 1}, vel{0, 0};
  const float g[2] = {1.5f, 1.0f};
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < 2; ++i) {
      vel[i] = 0.5f * vel[i] + g[i];
      w[i] -= 0.1f * vel[i];
    }
  }
  for (const auto& c : S::local_results(state)) {
    REQUIRE(c.w == w);
    REQUIRE(c.velocity == vel);
  }
}

namespace {
struct Model {
  BOOST_HANA_DEFINE_STRUCT(Model, (std::vector<float>, w), (std::vector<double>, d), (std::vector<float>, b));
  friend bool operator==(const Model&, const Model&) = default;
};
// Replica r's gradient at step t: not exact in binary, so any change of order shows in the bits.
std::vector<float> grad_w(int r, int t, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.37f * float(r + 1) / float(i + 3) + 0.011f * float(t);
  return g;
}
std::vector<double> grad_d(int r, int t, std::size_t n) {
  std::vector<double> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.29 * double(r + 2) / double(i + 7) - 0.013 * double(t);
  return g;
}
}  // namespace

TEST_CASE("update_sharded gives the bits of all_reduce + update on every copy, and keeps 1/N of the state",
          "[variables][mirrored][sharded]") {
  // w: ragged for every count below; d: shorter than some counts (empty cuts); b: empty.
  const std::size_t nw = 1009, nd = 5;
  for (const int R : {1, 2, 3, 7}) {
    CAPTURE(R);
    S s{{.replicas = R}};
    const Model init{std::vector<float>(nw, 0.5f), std::vector<double>(nd, -1.0), {}};
    auto sharded = s.make_variable(init);
    auto replicated = s.make_variable(init);
    const Model zeros{std::vector<float>(nw), std::vector<double>(nd), {}};
    auto velocity = s.distribute_values_from_function(
        [&](const mirror::ValueContext& c) { return mirror::cut_for_replica(zeros, c); });
    auto full_velocity = s.make_variable(zeros);
    std::size_t kept = 0;
    for (const Model& v : S::local_results(velocity)) {
      kept += v.w.size() + v.d.size();
      REQUIRE(v.b.empty());
    }
    REQUIRE(kept == nw + nd);  // the state lives once across the replicas
    for (int t = 0; t < 3; ++t) {
      s.run(
          [t, nw, nd](auto& ctx, auto& p, Model& vel, auto& q, auto& full_vel) {
            const int r = ctx.replica_id_in_sync_group();
            auto gw = grad_w(r, t, nw);
            auto gd = grad_d(r, t, nd);
            std::vector<float> gb;
            auto gw2 = gw;
            auto gd2 = gd;
            // The sharded step: each replica steps its cut; the state holds only that cut.
            p.update_sharded(
                [](auto param, auto grad, auto v) {
                  for (std::size_t i = 0; i < param.size(); ++i) {
                    v[i] = 0.9f * v[i] + grad[i];
                    param[i] -= 0.05f * v[i];
                  }
                },
                ReduceOp::mean, std::tuple{std::span<float>(gw), std::span<double>(gd), std::span<float>(gb)}, vel);
            // The replicated reference: the same arithmetic on whole leaves after an all_reduce.
            const auto g = ctx.all_reduce(ReduceOp::mean, std::tuple{std::span<float>(gw2), std::span<double>(gd2)});
            full_vel.update(
                [](Model& v, const auto& grads) {
                  for (std::size_t i = 0; i < v.w.size(); ++i) v.w[i] = 0.9f * v.w[i] + std::get<0>(grads)[i];
                  for (std::size_t i = 0; i < v.d.size(); ++i) v.d[i] = 0.9f * v.d[i] + std::get<1>(grads)[i];
                },
                g);
            const Model& vfull = full_vel.value();
            q.update(
                [&vfull](Model& m, const auto&) {
                  for (std::size_t i = 0; i < m.w.size(); ++i) m.w[i] -= 0.05f * vfull.w[i];
                  for (std::size_t i = 0; i < m.d.size(); ++i) m.d[i] -= 0.05f * vfull.d[i];
                },
                g);
          },
          sharded, velocity, replicated, full_velocity);
    }
    for (const Model& c : S::local_results(sharded)) {
      REQUIRE(mirror::test::same_bits(c.w.data(), replicated.value().w.data(), nw));
      REQUIRE(mirror::test::same_bits(c.d.data(), replicated.value().d.data(), nd));
    }
    REQUIRE(replicated.value().w[0] != 0.5f);  // it moved
  }
}

TEST_CASE("update_sharded refuses a gradient or a state of the wrong length before anything changes",
          "[variables][mirrored][sharded][errors]") {
  S s{{.replicas = 2}};
  const Model init{std::vector<float>(9, 1.0f), std::vector<double>(4, 2.0), {}};
  auto p = s.make_variable(init);
  auto velocity = s.distribute_values_from_function(
      [&](const mirror::ValueContext& c) { return mirror::cut_for_replica(init, c); });
  const auto step = [](auto param, auto grad, auto v) {
    for (std::size_t i = 0; i < param.size(); ++i) param[i] -= grad[i] + 0 * v[i];
  };
  // A gradient leaf one element short, on replica 1 only.
  REQUIRE_THROWS_MATCHES(
      s.run(
          [&](auto& ctx, auto& var, Model& v) {
            std::vector<float> gw(ctx.replica_id_in_sync_group() == 1 ? 8 : 9, 1.0f), gb;
            std::vector<double> gd(4, 1.0);
            var.update_sharded(step, ReduceOp::sum,
                               std::tuple{std::span<float>(gw), std::span<double>(gd), std::span<float>(gb)}, v);
          },
          p, velocity),
      mirror::shape_error, mirror::test::what(Catch::Contains("replica 1") && Catch::Contains("gradient leaf 0")));
  // A state that is not this replica's cut (the whole leaf).
  mirror::PerReplica<Model> whole(std::vector<Model>(2, init));
  REQUIRE_THROWS_MATCHES(
      s.run(
          [&](auto&, auto& var, Model& v) {
            std::vector<float> gw(9, 1.0f), gb;
            std::vector<double> gd(4, 1.0);
            var.update_sharded(step, ReduceOp::sum,
                               std::tuple{std::span<float>(gw), std::span<double>(gd), std::span<float>(gb)}, v);
          },
          p, whole),
      mirror::shape_error, mirror::test::what(Catch::Contains("cut_for_replica")));
  for (const Model& c : S::local_results(p)) REQUIRE(c == init);  // nothing changed
}

TEST_CASE("update_sharded with sharded gradient buckets gives the bits of update_sharded, any bucket cap",
          "[variables][mirrored][sharded][async]") {
  // Four leaves: w ragged for every count, d of another element type, a short float leaf (empty
  // cuts at R = 7) and an empty one; caps that put one leaf per bucket, and several.
  const std::size_t nw = 1009, nd = 5;
  using Grads = std::tuple<std::span<float>, std::span<double>, std::span<float>, std::span<float>>;
  for (const int R : {1, 2, 3, 7}) {
    for (const std::size_t cap : {std::size_t{0}, std::size_t{64}, std::size_t{1} << 20}) {
      CAPTURE(R, cap);
      S s{{.replicas = R}};
      const auto init = std::tuple{std::vector<float>(nw, 0.5f), std::vector<double>(nd, -1.0), std::vector<float>(3, 2.0f),
                                   std::vector<float>{}};
      auto bucketed = s.make_variable(init);
      auto plain = s.make_variable(init);
      const auto zeros = std::tuple{std::vector<float>(nw), std::vector<double>(nd), std::vector<float>(3),
                                    std::vector<float>{}};
      auto make_state = [&] {
        return s.distribute_values_from_function(
            [&](const mirror::ValueContext& c) { return mirror::cut_for_replica(zeros, c); });
      };
      auto vel_bucketed = make_state();
      auto vel_plain = make_state();
      const auto step = [](auto param, auto grad, auto v) {
        for (std::size_t i = 0; i < param.size(); ++i) {
          v[i] = 0.9f * v[i] + grad[i];
          param[i] -= 0.05f * v[i];
        }
      };
      using State = std::remove_cvref_t<decltype(zeros)>;
      for (int t = 0; t < 2; ++t) {
        s.run(
            [&, t](auto& ctx, auto& p, State& v, auto& q, State& w) {
              const int r = ctx.replica_id_in_sync_group();
              auto gw = grad_w(r, t, nw), gw2 = gw;
              auto gd = grad_d(r, t, nd), gd2 = gd;
              auto gs = grad_w(r + 5, t, 3), gs2 = gs;
              std::vector<float> ge;
              Grads grads{std::span<float>(gw), std::span<double>(gd), std::span<float>(gs), std::span<float>(ge)};
              auto buckets = ctx.gradient_buckets(ReduceOp::mean, grads, cap, mirror::sharded);
              for (const std::size_t i : {std::size_t{3}, std::size_t{2}, std::size_t{1}, std::size_t{0}}) buckets.ready(i);
              p.update_sharded(step, buckets, v);
              q.update_sharded(step, ReduceOp::mean,
                               Grads{std::span<float>(gw2), std::span<double>(gd2), std::span<float>(gs2),
                                     std::span<float>(ge)},
                               w);
            },
            bucketed, vel_bucketed, plain, vel_plain);
      }
      for (const auto& c : S::local_results(bucketed)) {
        REQUIRE(mirror::test::same_bits(std::get<0>(c).data(), std::get<0>(plain.value()).data(), nw));
        REQUIRE(mirror::test::same_bits(std::get<1>(c).data(), std::get<1>(plain.value()).data(), nd));
        REQUIRE(mirror::test::same_bits(std::get<2>(c).data(), std::get<2>(plain.value()).data(), 3));
      }
      REQUIRE(std::get<0>(plain.value())[0] != 0.5f);  // it moved
    }
  }
}

TEST_CASE("update_sharded with buckets: finished buckets and wrong lengths are refused, the variable unchanged",
          "[variables][mirrored][sharded][async][errors]") {
  S s{{.replicas = 2}};
  const auto init = std::tuple{std::vector<float>(9, 1.0f), std::vector<double>(4, 2.0)};
  auto p = s.make_variable(init);
  auto velocity = s.distribute_values_from_function(
      [&](const mirror::ValueContext& c) { return mirror::cut_for_replica(init, c); });
  using State = std::remove_cvref_t<decltype(init)>;
  const auto step = [](auto param, auto grad, auto v) {
    for (std::size_t i = 0; i < param.size(); ++i) param[i] -= grad[i] + 0 * v[i];
  };
  REQUIRE_THROWS_MATCHES(s.run(
                             [&](auto& ctx, auto& var, State& v) {
                               std::vector<float> gw(9, 1.0f);
                               std::vector<double> gd(4, 1.0);
                               auto g = std::tuple{std::span<float>(gw), std::span<double>(gd)};
                               auto b = ctx.gradient_buckets(ReduceOp::sum, g, 0, mirror::sharded);
                               (void)b.finish();
                               var.update_sharded(step, b, v);
                             },
                             p, velocity),
                         mirror::error, mirror::test::what(Catch::Contains("already finished")));
  // A gradient of another length than the variable's, on every replica (the buckets agree).
  REQUIRE_THROWS_MATCHES(s.run(
                             [&](auto& ctx, auto& var, State& v) {
                               std::vector<float> gw(8, 1.0f);
                               std::vector<double> gd(4, 1.0);
                               auto g = std::tuple{std::span<float>(gw), std::span<double>(gd)};
                               auto b = ctx.gradient_buckets(ReduceOp::sum, g, 0, mirror::sharded);
                               b.ready(0);
                               var.update_sharded(step, b, v);
                             },
                             p, velocity),
                         mirror::shape_error, mirror::test::what(Catch::Contains("gradient leaf 0")));
  for (const auto& c : S::local_results(p)) REQUIRE(c == init);  // nothing changed
}

TEST_CASE("a variable made by another strategy is rejected before any replica runs", "[variables][errors]") {
  S three{{.replicas = 3}}, two{{.replicas = 2}};
  auto v = three.make_variable(1.0f, VariableAggregation::sum);
  REQUIRE_THROWS_MATCHES(two.run([](auto&, auto& var) { var.assign_add(1.0f); }, v), mirror::shape_error, mirror::test::what(Catch::Contains("3 components")));
  require_all_copies(v, 1.0f);
}
