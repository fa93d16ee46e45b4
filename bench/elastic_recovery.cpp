// SPDX-License-Identifier: Apache-2.0
// What a lost worker costs (docs/multi-worker.md#losing-a-worker), run by bench/elastic_recovery.sh
// under Open MPI 5's mpirun; each process prints lines the script reads. A training loop over
// `--params` floats (the Fashion-MNIST MLP's 235,146 by default): each step `--compute-ms` of
// compute per replica, an all-reduce of the gradient, the update.
//   --mode elastic   mirror::elastic::train, a commit after every step; world rank W-1 writes the
//                    time (CLOCK_MONOTONIC) to --stamp and dies by SIGKILL in step --kill-step.
//                    Rank 0 prints the loss's phases from that stamp: found (the survivors'
//                    worker_lost_error), rebuilt (the next strategy built on the survivors),
//                    resumed (the failed step completed and committed on them):
//                      RECOVERY found_ms=F rebuilt_ms=B resumed_ms=T step_ms=S
//                    (S: the median step before the loss). Run with --with-ft ulfm.
//   --mode steady    no loss: blocks of --block steps with a commit after each step and without
//                    any, alternated --rounds times; rank 0 prints the median step of each:
//                      STEADY commit_ms=C plain_ms=P
//   --mode save      the restart baseline, before: a checkpoint (mirror::save) after every step
//                    to --checkpoint; rank W-1 writes --stamp and dies in --kill-step (without
//                    --with-ft the job ends: mpirun kills the others).
//   --mode restore   the restart baseline, after: restore --checkpoint and complete one step;
//                    rank 0 prints RESTORED when it has (the script times it from the launch).
#include <mirror/mirror.hpp>
#include <mirror/backends/mpi/elastic.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Strategy = mirror::Strategy<Cluster>;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string mode = "steady", stamp, checkpoint;
  int replicas = 1, params = 235146, compute_ms = 5, kill_step = 20, steps = 40, block = 20, rounds = 5;
};

double ms_since_epoch(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(t.time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One step: compute (a sleep standing for the backward pass), the gradient's all-reduce, the
// update. Returns the new parameters.
std::vector<float> step_once(Strategy& s, const options& o, const std::vector<float>& params, std::int64_t step) {
  const auto grads = s.run([&](auto& ctx) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.compute_ms));
    std::vector<float> g(params.size());
    const float shift = static_cast<float>(ctx.replica_id_in_sync_group() + step % 7) * 1e-3f;
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = params[k] * 1e-2f + shift;
    ctx.all_reduce(mirror::ReduceOp::mean, std::span<float>(g));
    return g;
  });
  std::vector<float> next = params;
  for (std::size_t k = 0; k < next.size(); ++k) next[k] -= 0.1f * grads[0][k];
  return next;
}

[[noreturn]] void die_stamped(const options& o) {
  std::ofstream(o.stamp) << std::to_string(ms_since_epoch(clock_type::now())) << "\n" << std::flush;
  std::raise(SIGKILL);
  std::abort();
}

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of_world() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void run_elastic(const options& o) {
  const int me = rank_of_world(), W = size_of_world();
  mirror::elastic::state<std::vector<float>> st{std::vector<float>(static_cast<std::size_t>(o.params), 1.0f)};
  std::vector<double> steps_ms;
  double found = 0, rebuilt = 0, resumed = 0;
  bool lost = false;
  mirror::elastic::train<Strategy>(
      Cluster{.local = {.replicas = o.replicas}}, st,
      [&](Strategy& s, mirror::elastic::state<std::vector<float>>& state) {
        if (lost && rebuilt == 0) rebuilt = ms_since_epoch(clock_type::now());
        std::vector<float> p = state.value();
        for (std::int64_t step = state.step(); step < o.steps; ++step) {
          const auto start = clock_type::now();
          if (step == o.kill_step && me == W - 1) die_stamped(o);
          p = step_once(s, o, p, step);
          state.commit(p, step + 1);
          if (lost && resumed == 0) resumed = ms_since_epoch(clock_type::now());
          if (!lost) steps_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
        }
      },
      [&](const mirror::worker_lost_error&) {
        lost = true;
        found = ms_since_epoch(clock_type::now());
      });
  if (me == 0) {
    double died = 0;
    std::ifstream(o.stamp) >> died;
    std::printf("RECOVERY found_ms=%.2f rebuilt_ms=%.2f resumed_ms=%.2f step_ms=%.2f\n", found - died, rebuilt - died,
                resumed - died, median(steps_ms));
  }
}

void run_steady(const options& o) {
  Strategy s{Cluster{.local = {.replicas = o.replicas}}};
  mirror::elastic::state<std::vector<float>> st{std::vector<float>(static_cast<std::size_t>(o.params), 1.0f)};
  std::vector<float> p = st.value();
  std::vector<double> with, without;
  std::int64_t step = 0;
  for (int round = 0; round < o.rounds; ++round) {
    for (const bool commit : {true, false}) {
      const auto start = clock_type::now();
      for (int k = 0; k < o.block; ++k, ++step) {
        p = step_once(s, o, p, step);
        if (commit) st.commit(p, step + 1);
      }
      const double per = std::chrono::duration<double, std::milli>(clock_type::now() - start).count() / o.block;
      (commit ? with : without).push_back(per);
    }
  }
  if (rank_of_world() == 0) std::printf("STEADY commit_ms=%.3f plain_ms=%.3f\n", median(with), median(without));
}

void run_save(const options& o) {
  Strategy s{Cluster{.local = {.replicas = o.replicas}}};
  auto v = s.make_variable(std::vector<float>(static_cast<std::size_t>(o.params), 1.0f));
  auto at = s.make_variable(std::int64_t{0});
  const int me = rank_of_world(), W = size_of_world();
  std::vector<float> p = v.value();
  for (std::int64_t step = 0; step < o.steps; ++step) {
    if (step == o.kill_step && me == W - 1) die_stamped(o);
    p = step_once(s, o, p, step);
    v.assign(p);
    at.assign(step + 1);
    mirror::save(s, o.checkpoint, v, at);
  }
}

void run_restore(const options& o) {
  Strategy s{Cluster{.local = {.replicas = o.replicas}}};
  auto v = s.make_variable(std::vector<float>(static_cast<std::size_t>(o.params), 0.0f));
  auto at = s.make_variable(std::int64_t{0});
  mirror::restore(s, o.checkpoint, v, at);
  std::vector<float> p = step_once(s, o, v.value(), at.value());
  v.assign(p);
  if (rank_of_world() == 0) {
    std::printf("RESTORED step=%lld\n", static_cast<long long>(at.value()));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  options o;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string key = argv[a], value = argv[a + 1];
    if (key == "--mode") o.mode = value;
    else if (key == "--stamp") o.stamp = value;
    else if (key == "--checkpoint") o.checkpoint = value;
    else if (key == "--replicas") o.replicas = std::stoi(value);
    else if (key == "--params") o.params = std::stoi(value);
    else if (key == "--compute-ms") o.compute_ms = std::stoi(value);
    else if (key == "--kill-step") o.kill_step = std::stoi(value);
    else if (key == "--steps") o.steps = std::stoi(value);
    else if (key == "--block") o.block = std::stoi(value);
    else if (key == "--rounds") o.rounds = std::stoi(value);
  }
  if (o.mode == "elastic") run_elastic(o);
  else if (o.mode == "steady") run_steady(o);
  else if (o.mode == "save") run_save(o);
  else if (o.mode == "restore") run_restore(o);
  std::fflush(stdout);
  // Open MPI 5.0's MPI_Finalize can wait for ever on the survivors of a death: the figures are
  // out, so leave after 5 s.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(0);
  }).detach();
  MPI_Finalize();
  return 0;
}
