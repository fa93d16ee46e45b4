// SPDX-License-Identifier: Apache-2.0
// A worker that dies, under MPI's fault-tolerance extension (Open MPI 5, mpirun --with-ft ulfm;
// built in build-ft by ./dev.sh ft-test): the survivors' error, the strategy on the survivors,
// and mirror::elastic's loop, checked against a serial replay. Each case kills workers (SIGKILL
// on themselves), so a launch runs one case (run_elastic.sh, tests/mpi/meson.build); rank 0
// always survives and reports. MIRROR_ELASTIC_REPLICAS sets R (default 1).

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#include <mirror/mirror.hpp>
#if MIRROR_HAS_MPI
#include <mirror/backends/mpi/elastic.hpp>  // mirror::elastic
#endif

#include "mpi/mpi_world.hpp"
#include "support/elastic_model.hpp"

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Strategy = mirror::Strategy<Cluster>;
using mirror::ReduceOp;
using clock_type = std::chrono::steady_clock;

// Long on purpose: a loss must be found at MPI's detection latency, far below it.
constexpr auto cluster_timeout = std::chrono::seconds(60);

int replicas() {
  const char* r = std::getenv("MIRROR_ELASTIC_REPLICAS");
  return r != nullptr && *r != '\0' ? std::atoi(r) : 1;
}

[[noreturn]] void die() {
  std::raise(SIGKILL);
  std::abort();
}

std::vector<int> range(int from, int to) {
  std::vector<int> v;
  for (int k = from; k < to; ++k) v.push_back(k);
  return v;
}

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Three runs whose all-reduce equals the serial sum over the global replicas.
void three_exact_runs(Strategy& s) {
  const int N = s.num_replicas_in_sync();
  for (int step = 1; step <= 3; ++step) {
    const auto out = s.run([&](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, (ctx.replica_id_in_sync_group() + 1) * step); });
    for (const int v : out) REQUIRE(v == step * N * (N + 1) / 2);
  }
}

// On the survivors of a strategy whose worker `victim` died: the error names it and its
// replicas, at MPI's detection latency; the next strategy is built on the survivors and is exact.
void check_loss(const mirror::worker_lost_error& e, double seconds, int victim, int R) {
  INFO(e.what());
  CHECK(e.workers() == std::vector<int>{victim});
  CHECK(e.replicas() == range(victim * R, (victim + 1) * R));
  CHECK_THAT(std::string(e.what()), Catch::Contains("worker " + std::to_string(victim) + " (global replica"));
  CHECK_THAT(std::string(e.what()), Catch::Contains("died"));
  CHECK(seconds < 20);  // found by MPI, not by the 60 s timeout
}

void later_calls_throw(Strategy& lost) {
  // Every later cross-worker call of the lost strategy throws the same error at once.
  const auto start = clock_type::now();
  CHECK_THROWS_AS(lost.reduce(ReduceOp::sum, lost.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); })),
                  mirror::worker_lost_error);
  CHECK(seconds_since(start) < 5);
}

}  // namespace

TEST_CASE("without the fault-tolerance extension a loss cannot be survived, and mirror::mpi::survivors says what to "
          "build",
          "[no-ulfm]") {
  REQUIRE_FALSE(mirror::mpi::fault_tolerant());
  try {
    mirror::mpi::survivors({});
    FAIL("no error");
  } catch (const mirror::backend_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("fault-tolerance extension (ULFM)"));
    CHECK_THAT(std::string(e.what()), Catch::Contains("ft-test"));
  }
}

TEST_CASE("a worker killed inside fn: every survivor's run throws worker_lost_error naming it, and a strategy on the "
          "survivors is exact",
          "[kill-in-fn]") {
  REQUIRE(mirror::mpi::fault_tolerant());
  const int R = replicas(), W = world_size();
  const int victim = W - 1;
  {
    Strategy s{Cluster{.local = {.replicas = R}, .timeout = cluster_timeout}};
    three_exact_runs(s);
    const auto start = clock_type::now();
    try {
      s.run([&](auto& ctx) {
        if (s.worker_index() == victim && ctx.replica_id_in_sync_group() == victim * R) die();
        return ctx.all_reduce(ReduceOp::sum, 1);
      });
      FAIL("no error on a survivor");
    } catch (const mirror::worker_lost_error& e) {
      check_loss(e, seconds_since(start), victim, R);
    }
    later_calls_throw(s);
  }  // destroying the lost strategy does not wait for the dead
  mirror::mpi::communicator survivors = mirror::mpi::survivors({});
  {
    Strategy s{Cluster{.local = {.replicas = R}, .comm = survivors, .timeout = cluster_timeout}};
    REQUIRE(s.num_workers() == W - 1);
    REQUIRE(s.num_replicas_in_sync() == (W - 1) * R);
    CHECK(s.worker_index() == world_rank());  // the survivors keep their order
    three_exact_runs(s);
  }
  mirror::mpi::release(survivors);
}

TEST_CASE("a worker killed between runs: the survivors' next call outside run throws worker_lost_error",
          "[kill-between-runs]") {
  REQUIRE(mirror::mpi::fault_tolerant());
  const int R = replicas(), W = world_size();
  const int victim = W - 1;
  Strategy s{Cluster{.local = {.replicas = R}, .timeout = cluster_timeout}};
  three_exact_runs(s);
  if (s.worker_index() == victim) die();
  const auto start = clock_type::now();
  try {
    s.reduce(ReduceOp::sum, s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); }));
    FAIL("no error on a survivor");
  } catch (const mirror::worker_lost_error& e) {
    check_loss(e, seconds_since(start), victim, R);
  }
}

TEST_CASE("a worker killed while a started all-reduce is in flight on the communication thread", "[kill-async]") {
  REQUIRE(mirror::mpi::fault_tolerant());
  const int R = replicas(), W = world_size();
  const int victim = W - 1;
  Strategy s{Cluster{.local = {.replicas = R}, .timeout = cluster_timeout}};
  three_exact_runs(s);
  const auto start = clock_type::now();
  try {
    s.run([&](auto& ctx) {
      std::vector<float> grads(1 << 16, 1.0f);
      auto pending = ctx.all_reduce_async(ReduceOp::sum, std::span<float>(grads));
      if (s.worker_index() == victim && ctx.replica_id_in_sync_group() == victim * R) die();
      pending.wait();
      return 0;
    });
    FAIL("no error on a survivor");
  } catch (const mirror::worker_lost_error& e) {
    check_loss(e, seconds_since(start), victim, R);
  }
}

using elastic_model::model;
using elastic_model::params;

namespace {

// Step `step` of `m` on `s`: each replica's rows of global batch `step` (`batch` rows), their
// gradient all-reduced (rows_gradient's layout). `before(ctx)` runs first on every replica: a
// death, in the case that kills inside fn.
template <class Before>
std::vector<std::int64_t> reduced_gradient(Strategy& s, const model& m, std::int64_t step, int batch, Before before) {
  const int per = batch / s.num_replicas_in_sync();
  const auto grads = s.run([&](auto& ctx) {
    before(ctx);
    const int g = ctx.replica_id_in_sync_group();
    auto mine = elastic_model::rows_gradient(m, step, g * per, (g + 1) * per);
    ctx.all_reduce(ReduceOp::sum, std::span<std::int64_t>(mine));
    return mine;
  });
  return grads[0];
}
std::vector<std::int64_t> reduced_gradient(Strategy& s, const model& m, std::int64_t step, int batch) {
  return reduced_gradient(s, m, step, batch, [](auto&) {});
}

}  // namespace

TEST_CASE("mirror::elastic::train without a loss: one strategy, every step committed, exact", "[no-loss]") {
  const int R = replicas(), W = world_size();
  const int batch = 12 * R;
  constexpr std::int64_t steps = 6;
  mirror::elastic::state<model> st{model{}};
  int calls = 0;
  mirror::elastic::train<Strategy>(Cluster{.local = {.replicas = R}, .timeout = cluster_timeout}, st,
                                   [&](Strategy& s, mirror::elastic::state<model>& state) {
    ++calls;
    model m = state.value();
    for (std::int64_t step = state.step(); step < steps; ++step) {
      elastic_model::apply_step(m, reduced_gradient(s, m, step, batch));
      state.commit(m, step + 1);
      REQUIRE(state.step() == step + 1);
    }
  });
  CHECK(calls == 1);
  const model expected = elastic_model::replay(steps, batch);
  CHECK(st.value().p == expected.p);
  CHECK(st.value().rows_seen == steps * batch);
  REQUIRE(st.epochs().size() == 1);
  CHECK(st.epochs()[0].workers == W);
}

TEST_CASE("mirror::elastic::train: two workers die (inside fn, then before a commit); the survivors finish exact, "
          "every row trained once",
          "[elastic-train]") {
  REQUIRE(mirror::mpi::fault_tolerant());
  const int R = replicas(), W = world_size();
  REQUIRE(W >= 3);
  const int batch = 12 * R * 4;  // divides over W*R, (W-1)*R and (W-2)*R replicas for W <= 4
  constexpr std::int64_t steps = 12, first_loss = 4, second_loss = 8;
  const int me = world_rank();
  mirror::elastic::state<model> st{model{}};
  mirror::elastic::train<Strategy>(Cluster{.local = {.replicas = R}, .timeout = cluster_timeout}, st,
                                   [&](Strategy& s, mirror::elastic::state<model>& state) {
    model m = state.value();
    for (std::int64_t step = state.step(); step < steps; ++step) {
      REQUIRE(batch % s.num_replicas_in_sync() == 0);
      const auto total = reduced_gradient(s, m, step, batch, [&](auto& ctx) {
        // First loss: the last world rank, inside fn, before its collective.
        if (step == first_loss && me == W - 1 && ctx.replica_id_in_sync_group() == s.worker_index() * R) die();
      });
      REQUIRE(total[params] == batch);  // every row of the global batch, once
      elastic_model::apply_step(m, total);
      // Second loss: world rank 1, after its step, before its commit: the others still commit
      // that step (it completed everywhere), and the next finds the loss. Half a
      // second after the first: Open MPI 5.0's MPI_Finalize can wait for ever on survivors of two
      // deaths a few milliseconds apart (docs/multi-worker.md#losing-a-worker).
      if (step == second_loss && me == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        die();
      }
      state.commit(m, step + 1);
    }
  });
  const model expected = elastic_model::replay(steps, batch);
  CHECK(st.step() == steps);
  CHECK(st.value().p == expected.p);
  CHECK(st.value().rows_seen == expected.rows_seen);
  // The strategies it ran on: W workers from step 0, W-1 from the step that failed, W-2 from the
  // step after the second loss's commit.
  REQUIRE(st.epochs().size() == 3);
  CHECK(st.epochs()[0].first_step == 0);
  CHECK(st.epochs()[0].workers == W);
  CHECK(st.epochs()[1].first_step == first_loss);
  CHECK(st.epochs()[1].workers == W - 1);
  CHECK(st.epochs()[1].replicas == (W - 1) * R);
  CHECK(st.epochs()[2].first_step == second_loss + 1);
  CHECK(st.epochs()[2].workers == W - 2);
}

TEST_CASE("mirror::elastic::train: a survivor one commit ahead of the others resumes from the commit they all hold",
          "[rollback]") {
  // No worker dies: every worker throws worker_lost_error at the same point, after worker 0 alone
  // committed a step the others did not reach (as when a death ends a step's all-reduce on some
  // survivors only). Its extra commit holds wrong parameters: resuming from it would show.
  REQUIRE(mirror::mpi::fault_tolerant());
  const int R = replicas(), W = world_size();
  const int batch = 12 * R;
  constexpr std::int64_t steps = 8, split = 5;
  mirror::elastic::state<model> st{model{}};
  int losses = 0;
  mirror::elastic::train<Strategy>(
      Cluster{.local = {.replicas = R}, .timeout = cluster_timeout}, st,
      [&](Strategy& s, mirror::elastic::state<model>& state) {
        model m = state.value();
        for (std::int64_t step = state.step(); step < steps; ++step) {
          elastic_model::apply_step(m, reduced_gradient(s, m, step, batch));
          state.commit(m, step + 1);
          if (step + 1 == split && state.epochs().size() == 1) {
            if (s.worker_index() == 0) {
              model ahead = m;
              ahead.p[0] += 12345;  // a step nobody else completed
              state.commit(ahead, split + 1);
            }
            throw mirror::worker_lost_error("a loss, for the test", {}, {});
          }
        }
      },
      [&](const mirror::worker_lost_error&) { ++losses; });
  CHECK(losses == 1);
  const model expected = elastic_model::replay(steps, batch);
  CHECK(st.value().p == expected.p);
  CHECK(st.value().rows_seen == expected.rows_seen);
  REQUIRE(st.epochs().size() == 2);
  CHECK(st.epochs()[1].first_step == split);
  CHECK(st.epochs()[1].workers == W);
}
