// SPDX-License-Identifier: Apache-2.0
// broadcast: ctx.broadcast(std::span<E>, 0) inside a running fn (every replica's buffer receives
// replica 0's, in place), against a std::thread team where every thread memcpy's buffer 0 into
// its own buffer with a std::barrier per step. Axes: impl, type, replicas, bytes.
#include <cstring>
#include "common.hpp"

namespace {

void counters(benchmark::State& state, int replicas, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["busbw"] = benchmark::Counter(static_cast<double>(bytes) * (replicas - 1) / replicas,
                                               benchmark::Counter::kIsIterationInvariantRate);  // nccl-tests' broadcast
  state.counters["replicas"] = replicas;
  state.counters["bytes"] = static_cast<double>(bytes);
}

void mirror_broadcast(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  bench::buffers<float> buf(replicas, n);
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = replicas});
  bench::replica_loop(state, strategy, [&](auto& ctx) {
    ctx.broadcast(std::span<float>(buf[ctx.replica_id_in_sync_group()], n), 0);
  });
  counters(state, replicas, n * sizeof(float));
}

void std_thread_broadcast(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  bench::buffers<float> buf(replicas, n);
  bench::team_loop(state, replicas, [&](int r) {
    if (r != 0) std::memcpy(buf[r], buf[0], n * sizeof(float));
  });
  counters(state, replicas, n * sizeof(float));
}

}  // namespace

int main(int argc, char** argv) {
  return bench::main(argc, argv, "broadcast", [] {
    constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
    for (int r : {2, 8}) {
      for (std::size_t b : {std::size_t{4}, 64 * KiB, MiB, 16 * MiB}) {
        auto nm = [&](const char* impl) { return bench::name("broadcast", impl, "float", r, b); };
        bench::add(nm("default"), [=](benchmark::State& s) { mirror_broadcast(s, r, b); });
        bench::add(nm("std_thread"), [=](benchmark::State& s) { std_thread_broadcast(s, r, b); });
      }
    }
  });
}
