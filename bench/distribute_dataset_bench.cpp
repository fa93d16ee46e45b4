// SPDX-License-Identifier: Apache-2.0
// distribute_dataset: a pass over global batches split over the replicas (views, no copy), each
// step one Strategy::run whose fn sums its slice, against a std::thread team that splits the
// same batches by the same rule with a std::barrier per step. items_per_second = samples/s.
// Axes: impl, replicas, bytes (of one global batch).
#include <numeric>
#include "common.hpp"

namespace {

constexpr std::size_t steps = 64;

std::vector<std::vector<float>> batches(std::size_t n) {
  std::vector<std::vector<float>> out(steps, std::vector<float>(n));
  for (std::size_t s = 0; s < steps; ++s) std::iota(out[s].begin(), out[s].end(), static_cast<float>(s));
  return out;
}

void counters(benchmark::State& state, int replicas, std::size_t n) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * steps * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * steps * n * sizeof(float)));
  state.counters["replicas"] = replicas;
  state.counters["bytes"] = static_cast<double>(n * sizeof(float));
}

void mirror_dataset(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = bytes / sizeof(float);
  const auto data = batches(n);
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = replicas});
  std::vector<double> sums(static_cast<std::size_t>(replicas) * 8);
  for (auto _ : state) {
    for (const auto& batch : strategy.distribute_dataset(data)) {
      strategy.run(
          [&](auto& ctx, const auto& b) {
            sums[static_cast<std::size_t>(ctx.replica_id_in_sync_group()) * 8] += std::accumulate(b.begin(), b.end(), 0.0);
          },
          batch);
    }
  }
  benchmark::DoNotOptimize(sums.data());
  counters(state, replicas, n);
}

void std_thread_dataset(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = bytes / sizeof(float);
  const auto data = batches(n);
  std::vector<double> sums(static_cast<std::size_t>(replicas) * 8);
  std::barrier sync(replicas);
  auto pass = [&](int r) {
    const std::size_t R = static_cast<std::size_t>(replicas), ur = static_cast<std::size_t>(r);
    for (const auto& g : data) {  // the first n mod R replicas get one more element
      const std::size_t per = g.size() / R, extra = g.size() % R;
      const std::size_t lo = ur * per + std::min(ur, extra), len = per + (ur < extra ? 1 : 0);
      sums[ur * 8] += std::accumulate(g.begin() + static_cast<std::ptrdiff_t>(lo),
                                      g.begin() + static_cast<std::ptrdiff_t>(lo + len), 0.0);
      sync.arrive_and_wait();
    }
  };
  bench::team(replicas, [&](int r) {
    if (r == 0) {
      for (auto _ : state) pass(0);
    } else {
      for (benchmark::IterationCount i = 0; i < state.max_iterations; ++i) pass(r);
    }
  });
  benchmark::DoNotOptimize(sums.data());
  counters(state, replicas, n);
}

}  // namespace

int main(int argc, char** argv) {
  return bench::main(argc, argv, "distribute_dataset", [] {
    constexpr std::size_t KiB = 1024;
    for (int r : {2, 8}) {
      for (std::size_t b : {4 * KiB, 256 * KiB}) {
        auto nm = [&](const char* impl) { return bench::name("distribute_dataset", impl, "float", r, b); };
        bench::add(nm("default"), [=](benchmark::State& s) { mirror_dataset(s, r, b); });
        bench::add(nm("std_thread"), [=](benchmark::State& s) { std_thread_dataset(s, r, b); });
      }
    }
  });
}
