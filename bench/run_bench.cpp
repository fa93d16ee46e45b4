// SPDX-License-Identifier: Apache-2.0
// run latency: one Strategy::run per step, its fn doing a 1-float all_reduce, against an OpenMP
// parallel region with a reduction (the same work: every thread contributes one float, the
// caller gets the sum). Axes: impl, replicas.
//   impl:run_all_reduce   run(fn) where fn all_reduces one float and uses it (returns void)
//   impl:run_mirrored     the same fn returning the Synced value: run returns Mirrored<float>
//   impl:run_empty        run(fn) with an empty fn: the fork-join alone
//   impl:openmp           #pragma omp parallel num_threads(R) reduction(+ : x)
#include <omp.h>
#include "common.hpp"

namespace {

void counters(benchmark::State& state, int replicas) {
  state.counters["replicas"] = replicas;
  state.counters["bytes"] = sizeof(float);
}

void run_all_reduce(benchmark::State& state, int replicas) {
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = replicas});
  for (auto _ : state) {
    strategy.run([](auto& ctx) {
      float x = *ctx.all_reduce(mirror::ReduceOp::sum, 1.0f);
      benchmark::DoNotOptimize(x);
    });
  }
  counters(state, replicas);
}

void run_mirrored(benchmark::State& state, int replicas) {
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = replicas});
  for (auto _ : state) {
    auto m = strategy.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, 1.0f); });
    benchmark::DoNotOptimize(m);
  }
  counters(state, replicas);
}

void run_empty(benchmark::State& state, int replicas) {
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = replicas});
  for (auto _ : state) strategy.run([] {});
  counters(state, replicas);
}

void openmp(benchmark::State& state, int replicas) {
  for (auto _ : state) {
    float x = 0;
#pragma omp parallel num_threads(replicas) reduction(+ : x)
    { x += 1.0f; }
    benchmark::DoNotOptimize(x);
  }
  counters(state, replicas);
}

}  // namespace

int main(int argc, char** argv) {
  return bench::main(argc, argv, "run", [] {
    for (int r : {1, 2, 4, 8, 16}) {
      auto nm = [&](const char* impl) { return bench::name("run", impl, "float", r, sizeof(float)); };
      bench::add(nm("run_all_reduce"), [r](benchmark::State& s) { run_all_reduce(s, r); });
      bench::add(nm("run_mirrored"), [r](benchmark::State& s) { run_mirrored(s, r); });
      bench::add(nm("run_empty"), [r](benchmark::State& s) { run_empty(s, r); });
      bench::add(nm("openmp"), [r](benchmark::State& s) { openmp(s, r); });
    }
  });
}
