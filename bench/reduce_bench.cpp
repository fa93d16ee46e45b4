// SPDX-License-Identifier: Apache-2.0
// reduce: Strategy::reduce(sum, PerReplica<std::vector<E>>) in cross-replica context (parallel
// over the pool above 256 KiB), against a serial loop on the calling thread (what a user writes
// for the same result: out[i] = c_0[i] + ... + c_{R-1}[i]). Axes: impl, type, replicas, bytes.
#include "common.hpp"

namespace {

template <class E>
mirror::PerReplica<std::vector<E>> components(int replicas, std::size_t n) {
  std::vector<std::vector<E>> c;
  for (int r = 0; r < replicas; ++r) {
    c.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) c.back()[i] = static_cast<E>(r + static_cast<int>(i % 7));
  }
  return mirror::PerReplica<std::vector<E>>(std::move(c));
}

template <class Ops, class E>
void mirror_reduce(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(E));
  mirror::Strategy<mirror::devices::Threads, Ops> strategy({.replicas = replicas});
  const auto v = components<E>(replicas, n);
  for (auto _ : state) {
    auto out = strategy.reduce(mirror::ReduceOp::sum, v);
    benchmark::DoNotOptimize(out.data());
  }
  bench::all_reduce_counters(state, replicas, n * sizeof(E));
}

template <class E>
void serial_loop(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(E));
  const auto v = components<E>(replicas, n);
  for (auto _ : state) {
    std::vector<E> out(v[0]);
    for (int r = 1; r < replicas; ++r) {
      const std::vector<E>& c = v[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < n; ++i) out[i] += c[i];
    }
    benchmark::DoNotOptimize(out.data());
  }
  bench::all_reduce_counters(state, replicas, n * sizeof(E));
}

}  // namespace

int main(int argc, char** argv) {
  return bench::main(argc, argv, "reduce", [] {
    using namespace mirror::ops;
    constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
    for (int r : {2, 8}) {
      for (std::size_t b : {4 * KiB, 64 * KiB, MiB, 16 * MiB}) {
        auto nm = [&](const char* impl) { return bench::name("reduce", impl, "float", r, b); };
        bench::add(nm("default"), [=](benchmark::State& s) { mirror_reduce<ChunkOwnerAllReduce, float>(s, r, b); });
        bench::add(nm("serial_loop"), [=](benchmark::State& s) { serial_loop<float>(s, r, b); });
      }
    }
    bench::add(bench::name("reduce", "default", "double", 2, 16 * MiB),
               [](benchmark::State& s) { mirror_reduce<ChunkOwnerAllReduce, double>(s, 2, 16 * MiB); });
    bench::add(bench::name("reduce", "serial_loop", "double", 2, 16 * MiB),
               [](benchmark::State& s) { serial_loop<double>(s, 2, 16 * MiB); });
  });
}
