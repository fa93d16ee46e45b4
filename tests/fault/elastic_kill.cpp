// SPDX-License-Identifier: Apache-2.0
// One trial of the elastic kill harness (tests/fault/elastic_kill.py, docs/multi-worker.md#losing-a-worker):
// a mirror::elastic loop over the integer model of tests/support/elastic_model.hpp, in which the
// workers the plan names kill themselves (SIGKILL) at the planned point; the harness may also
// kill one from outside. Every survivor checks its result against the serial replay and prints
// one line:
//   RESULT rank=R ok=1 steps=S rows=N epochs=W@k,W@k,... [why=...]
// Run under mpirun --with-ft ulfm (Open MPI 5), as the harness does:
//   elastic_kill --replicas R --steps S --plan RANK:POINT:STEP:DELAY_US[,...] [--pid-dir DIR]
//                [--step-ms MS (each step's compute, default 5)]
// POINT: fn (in fn, before the step's all-reduce), collective (DELAY_US after entering fn: in or
// around the all-reduce), between (after the run, before the commit), commit (DELAY_US after the
// commit began: in its copy, or early in the next step), recovery (DELAY_US after this worker learned of a loss: while the
// survivors shrink, build the next strategy and agree on their latest common commit). STEP: the first step at which it fires
// (recovery: ignored). Built only against an MPI with the fault-tolerance extension.

#include <mirror/mirror.hpp>
#include <mirror/backends/mpi/elastic.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "support/elastic_model.hpp"

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Strategy = mirror::Strategy<Cluster>;
using elastic_model::model;

struct kill_plan {
  int rank = -1;
  std::string point;
  std::int64_t step = 0;
  int delay_us = 0;
};

std::vector<kill_plan> parse_plan(const std::string& text) {
  std::vector<kill_plan> plans;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string one = text.substr(at, end - at);
    kill_plan k;
    char point[32] = {};
    long long step = 0;
    if (std::sscanf(one.c_str(), "%d:%31[a-z]:%lld:%d", &k.rank, point, &step, &k.delay_us) != 4) {
      throw std::invalid_argument("elastic_kill: --plan entry '" + one + "': expected RANK:POINT:STEP:DELAY_US");
    }
    k.point = point;
    k.step = step;
    plans.push_back(k);
    at = end + 1;
  }
  return plans;
}

[[noreturn]] void die() {
  std::raise(SIGKILL);
  std::abort();
}

void die_after(int delay_us) {
  std::thread([delay_us] {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    die();
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int replicas = 1;
  std::int64_t steps = 30;
  std::string plan_text, pid_dir;
  int step_ms = 5;  // each replica's compute per step, so that an outside kill lands mid-training
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string key = argv[a];
    if (key == "--replicas") replicas = std::atoi(argv[a + 1]);
    else if (key == "--steps") steps = std::atoll(argv[a + 1]);
    else if (key == "--plan") plan_text = argv[a + 1];
    else if (key == "--pid-dir") pid_dir = argv[a + 1];
    else if (key == "--step-ms") step_ms = std::atoi(argv[a + 1]);
  }
  if (!pid_dir.empty()) std::ofstream(pid_dir + "/rank" + std::to_string(rank) + ".pid") << getpid() << "\n";
  const int batch = 24;  // divides over 1-4 workers x 1-2 replicas
  std::vector<kill_plan> mine;
  for (const kill_plan& k : parse_plan(plan_text)) {
    if (k.rank == rank) mine.push_back(k);
  }
  const auto fires = [&](const char* point, std::int64_t step) -> const kill_plan* {
    for (const kill_plan& k : mine) {
      if (k.point == point && step >= k.step) return &k;
    }
    return nullptr;
  };

  std::string why;
  mirror::elastic::state<model> st{model{}};
  try {
    mirror::elastic::train<Strategy>(
        Cluster{.local = {.replicas = replicas}, .timeout = std::chrono::seconds(30)}, st,
        [&](Strategy& s, mirror::elastic::state<model>& state) {
          model m = state.value();
          for (std::int64_t step = state.step(); step < steps; ++step) {
            const int per = batch / s.num_replicas_in_sync();
            if (const kill_plan* k = fires("collective", step)) die_after(k->delay_us);
            const auto grads = s.run([&](auto& ctx) {
              if (fires("fn", step) != nullptr && ctx.replica_id_in_sync_group() == s.worker_index() * replicas) die();
              const int g = ctx.replica_id_in_sync_group();
              std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
              auto part = elastic_model::rows_gradient(m, step, g * per, (g + 1) * per);
              ctx.all_reduce(mirror::ReduceOp::sum, std::span<std::int64_t>(part));
              return part;
            });
            if (grads[0][elastic_model::params] != batch) {
              why += "step " + std::to_string(step) + " reduced " + std::to_string(grads[0][elastic_model::params]) +
                     " rows; ";
            }
            elastic_model::apply_step(m, grads[0]);
            if (fires("between", step) != nullptr) die();
            if (const kill_plan* k = fires("commit", step)) die_after(k->delay_us);
            state.commit(m, step + 1);
          }
        },
        [&](const mirror::worker_lost_error&) {
          if (const kill_plan* k = fires("recovery", 0)) die_after(k->delay_us);
        });
  } catch (const std::exception& e) {
    why += std::string("train threw: ") + e.what() + "; ";
  }
  const model expected = elastic_model::replay(steps, batch);
  if (st.step() != steps) why += "ended at step " + std::to_string(st.step()) + "; ";
  if (st.value().p != expected.p) why += "parameters differ from the serial replay; ";
  if (st.value().rows_seen != expected.rows_seen) {
    why += "trained " + std::to_string(st.value().rows_seen) + " rows, not " + std::to_string(expected.rows_seen) + "; ";
  }
  std::string epochs;
  for (const auto& e : st.epochs()) {
    epochs += (epochs.empty() ? "" : ",") + std::to_string(e.workers) + "@" + std::to_string(e.first_step);
  }
  std::printf("RESULT rank=%d ok=%d steps=%lld rows=%lld epochs=%s%s%s\n", rank, why.empty() ? 1 : 0,
              static_cast<long long>(st.step()), static_cast<long long>(st.value().rows_seen), epochs.c_str(),
              why.empty() ? "" : " why=", why.c_str());
  std::fflush(stdout);
  // Open MPI 5.0's MPI_Finalize can wait for ever on the survivors of a death (its launcher's
  // final barrier still counts the dead): the verdict is out, so leave after 5 s.
  std::thread([ok = why.empty()] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::printf("FINALIZE-HANG rank\n");
    std::fflush(stdout);
    std::_Exit(ok ? 0 : 1);
  }).detach();
  MPI_Finalize();
  return why.empty() ? 0 : 1;
}
