// SPDX-License-Identifier: Apache-2.0
// docs/multi-worker.md#losing-a-worker: a training loop that goes on after a worker dies, run with
//   mpirun --with-ft ulfm -np 3 --bind-to none build-ft/examples/guide_elastic
// on Open MPI 5 (./dev.sh ft-test builds against it); with MIRROR_EXAMPLE_KILL_STEP=k the last
// worker kills itself in step k and the others finish. Elsewhere (Open MPI 4.1, the test
// example_guide_elastic_2x2) the same loop runs without a loss. The snippet between the
// // [name] markers is copied into the page (tools/check_docs.py keeps the two equal). Exits 1
// on a wrong value.
#include <mirror/mirror.hpp>
#if MIRROR_HAS_MPI
#include <mirror/backends/mpi/elastic.hpp>  // mirror::elastic
#endif
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

int main() {
#if MIRROR_HAS_MPI
  const char* kill_step = std::getenv("MIRROR_EXAMPLE_KILL_STEP");
  const std::int64_t doomed_step = kill_step != nullptr ? std::atoll(kill_step) : -1;
  constexpr std::int64_t steps = 20;
  constexpr int rows_per_batch = 24;  // a global batch: split over 24, 12, 8, 6, 4, 3, 2 or 1 replicas
  // [elastic]
  using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
  using Strategy = mirror::Strategy<Cluster>;
  struct model {
    double weight = 0;           // the parameters, equal on every worker
    std::int64_t rows_seen = 0;  // how many rows the committed steps trained on
  };
  mirror::elastic::state<model> state{model{}};  // what the last commit holds, and its step
  mirror::elastic::train<Strategy>(Cluster{.local = {.replicas = 2}}, state, [&](Strategy& s, auto& st) {
    model m = st.value();  // the last commit: where this strategy starts
    for (std::int64_t step = st.step(); step < steps; ++step) {
      const int n = s.num_replicas_in_sync(), per = rows_per_batch / n;  // n shrinks after a loss
      const auto totals = s.run([&](auto& ctx) {
        if (step == doomed_step && st.epochs().size() == 1 && s.worker_index() == s.num_workers() - 1) std::raise(SIGKILL);
        double grad[2] = {0, 0};  // this replica's rows of global batch `step`: sum of (target - weight), count
        for (int row = ctx.replica_id_in_sync_group() * per; row < (ctx.replica_id_in_sync_group() + 1) * per; ++row) {
          grad[0] += static_cast<double>(row % 5) - m.weight;
          grad[1] += 1;
        }
        ctx.all_reduce(mirror::ReduceOp::sum, std::span<double>(grad));
        return std::vector<double>(grad, grad + 2);
      });
      m.weight += 0.5 * totals[0][0] / totals[0][1];
      m.rows_seen += static_cast<std::int64_t>(totals[0][1]);
      st.commit(m, step + 1);  // a copy: after a loss every survivor resumes from a commit all hold
    }
  });
  // [/elastic]
  const model& m = state.value();
  if (state.epochs().front().workers == state.epochs().back().workers) {
    std::printf("weight %.6f after %lld rows on %d workers\n", m.weight, static_cast<long long>(m.rows_seen),
                state.epochs().back().workers);
  } else {
    std::printf("weight %.6f after %lld rows; a worker died at step %lld, %d workers finished\n", m.weight,
                static_cast<long long>(m.rows_seen), static_cast<long long>(state.epochs().back().first_step),
                state.epochs().back().workers);
  }
  // Every step trained on every row of its global batch, once; the weight tends to the mean
  // target, 2 (rows % 5 over 24 rows: 46/24 = 1.9167).
  const bool ok = m.rows_seen == steps * rows_per_batch && m.weight >= 1.9 && m.weight <= 1.93;
  if (!ok) {
    std::printf("FAILED: %lld rows (expected %lld), weight %g\n", static_cast<long long>(m.rows_seen),
                static_cast<long long>(steps * rows_per_batch), m.weight);
  }
  // After a loss, Open MPI 5.0's MPI_Finalize (at exit) can wait for ever on the survivors
  // (docs/multi-worker.md#losing-a-worker): the results are out, so leave without it.
  if (state.epochs().size() > 1) {
    std::fflush(stdout);
    std::_Exit(ok ? 0 : 1);
  }
  if (!ok) return 1;
#else
  std::printf("built without MPI: nothing to show\n");
#endif
  return 0;
}
