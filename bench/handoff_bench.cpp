// SPDX-License-Identifier: Apache-2.0
// The floor under devices::Cluster's hand-off to its communication thread (docs/multi-worker.md,
// "What it costs"): what it costs one thread to hand work to another and get the answer back, with
//  - impl:yield_one_core: both threads pinned to one CPU, each waiting with sched_yield (what a
//    worker that has one core for its caller and its communication thread pays: the scheduler
//    switches threads twice per collective);
//  - impl:spin_two_cores: the threads on two CPUs, each spinning on the other's flag (what the
//    same hand-off costs where the communication thread has a core to spare: a cache-line
//    exchange each way).
// One iteration is one round trip (two hand-offs); the counter `per_handoff` is seconds per
// hand-off.
//
//   build/bench/handoff_bench [--benchmark_repetitions=5]

#include <benchmark/benchmark.h>

#include <atomic>
#include <thread>
#include <pthread.h>
#include <sched.h>

#include "common.hpp"

namespace {

// The CPUs this process may use, in order (the benchmark pins within them).
std::vector<int> allowed_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  return cpus;
}

bool pin(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
}

// Ping-pong on one word: the caller writes 1 (the job), the partner answers 0 (done).
template <bool Yield>
void handoff(benchmark::State& state, int caller_cpu, int partner_cpu) {
  alignas(64) std::atomic<int> turn{0};
  alignas(64) std::atomic<bool> stop{false};
  cpu_set_t saved;
  pthread_getaffinity_np(pthread_self(), sizeof saved, &saved);
  if (!pin(caller_cpu)) {
    state.SkipWithError("cannot pin the caller");
    return;
  }
  auto wait_for = [](const std::atomic<int>& t, int value, const std::atomic<bool>* quit) {
    while (t.load(std::memory_order_acquire) != value) {
      if (quit != nullptr && quit->load(std::memory_order_relaxed)) return;
      if constexpr (Yield) {
        sched_yield();
      } else {
        mirror::threads::cpu_relax();
      }
    }
  };
  std::thread partner([&] {
    pin(partner_cpu);
    for (;;) {
      wait_for(turn, 1, &stop);
      if (stop.load(std::memory_order_relaxed)) return;
      turn.store(0, std::memory_order_release);
    }
  });
  for (auto _ : state) {
    turn.store(1, std::memory_order_release);
    wait_for(turn, 0, nullptr);
  }
  stop.store(true, std::memory_order_relaxed);
  partner.join();
  pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
  // Hand-offs per second, inverted: seconds per hand-off.
  state.counters["per_handoff"] = benchmark::Counter(2.0 * static_cast<double>(state.iterations()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

}  // namespace

int main(int argc, char** argv) {
  bench::add_context("handoff");
  const std::vector<int> cpus = allowed_cpus();
  if (!cpus.empty()) {
    benchmark::RegisterBenchmark("handoff/impl:yield_one_core/real_time",
                                 [c = cpus[0]](benchmark::State& s) { handoff<true>(s, c, c); })
        ->UseRealTime();
  }
  if (cpus.size() >= 2) {
    benchmark::RegisterBenchmark("handoff/impl:spin_two_cores/real_time",
                                 [a = cpus[0], b = cpus[1]](benchmark::State& s) { handoff<false>(s, a, b); })
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
