// SPDX-License-Identifier: Apache-2.0
// all_reduce: in-place all-reduce of one std::span leaf per replica (the path for large buffers),
// inside a running fn, against the hand-written baselines on the same buffers:
//   impl:default|one_device|hierarchical  mirror, ctx.all_reduce(sum, std::span<E>) per step
//   impl:naive        a std::thread chunk-owner all-reduce with a std::barrier per step, written
//                     as a user would (element loop, replicas in order, every replica's buffer
//                     written element by element)
//   impl:hand_blocked the same written by hand as a careful programmer does: each thread combines
//                     its 1/R in blocks that stay in L1 (memcpy in, a vectorisable add loop per
//                     other replica, memcpy back into every buffer): the bar mirror's default
//                     policy must clear
//   impl:copy         a streaming copy of the same bytes (each thread memcpy's its 1/R of every
//                     buffer into a second set): the memory-bandwidth bound, 2*R*S bytes moved
//   impl:in_place     each thread adds 1 to its 1/R of every buffer, in place, in 16-byte
//                     vectors: the memory traffic of an in-place all-reduce (every byte read
//                     and written once) and nothing else, so the floor for any of them. Its
//                     own ratios (R x S against 2 x S) show what the memory hierarchy alone
//                     imposes on the oversubscription targets (bench/report.py)
// Axes: impl, type, replicas, bytes (per replica). Counters: bytes_per_second = algbw, busbw
// (nccl-tests), databw = R*S / time (every replica's bytes per second).
#include <cstring>
#include "common.hpp"

namespace {

void data_counter(benchmark::State& state, int replicas, std::size_t bytes) {
  bench::all_reduce_counters(state, replicas, bytes);
  state.counters["databw"] = benchmark::Counter(static_cast<double>(bytes) * replicas,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

template <class Ops, class E>
void mirror_all_reduce(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(E));
  bench::buffers<E> buf(replicas, n);
  mirror::Strategy<mirror::devices::Threads, Ops> strategy({.replicas = replicas});
  bench::replica_loop(state, strategy, [&](auto& ctx) {
    ctx.all_reduce(mirror::ReduceOp::sum, std::span<E>(buf[ctx.replica_id_in_sync_group()], n));
  });
  data_counter(state, replicas, n * sizeof(E));
}

template <class E>
void naive_all_reduce(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(E));
  bench::buffers<E> buf(replicas, n);
  bench::team_loop(state, replicas, [&](int r) {
    const auto [lo, hi] = bench::chunk<E>(n, r, replicas);
    for (std::size_t i = lo; i < hi; ++i) {
      E s = buf[0][i];
      for (int q = 1; q < replicas; ++q) s += buf[q][i];
      for (int q = 0; q < replicas; ++q) buf[q][i] = s;
    }
  });
  data_counter(state, replicas, n * sizeof(E));
}

// hand_blocked: each thread combines its 1/R in blocks that stay in L1, in a local accumulator:
// memcpy replica 0's block in, add the others' with a loop GCC vectorises at -O2 (a constant
// trip count for whole blocks: one addps per 4 floats), memcpy the block back into every
// buffer. One std::barrier per step, as in the naive loop. The block: 4, 8, 16 and 32 KiB were
// tried at 2, 4, 8, 16 replicas x 1, 16, 64 MiB, 2 runs of 5 interleaved repetitions
// (bench/results/hand_blocked.md): at 2 replicas 4 KiB was the fastest or tied in 5 of 6 cells
// (16 KiB in the other), at 16 replicas the slowest in 5 of 6; from 8 replicas up 8 KiB was as
// fast as any. So 4 KiB below 8 replicas (the block, replica 0's and the other's fit L1 with
// room), 8 KiB from 8 up.
template <class E, std::size_t BlockBytes>
void hand_blocked_step(const bench::buffers<E>& buf, int r) {
  constexpr std::size_t block = BlockBytes / sizeof(E);
  const int replicas = buf.replicas();
  const auto [lo, hi] = bench::chunk<E>(buf.count(), r, replicas);
  alignas(64) E acc[block];
  for (std::size_t i = lo; i < hi; i += block) {
    const std::size_t m = std::min(block, hi - i);
    // Replica 0 first and the others in order, as the naive loop and mirror combine them.
    std::memcpy(acc, buf[0] + i, m * sizeof(E));
    for (int q = 1; q < replicas; ++q) {
      const E* __restrict src = buf[q] + i;
      if (m == block) {
        for (std::size_t j = 0; j < block; ++j) acc[j] += src[j];
      } else {
        for (std::size_t j = 0; j < m; ++j) acc[j] += src[j];
      }
    }
    for (int q = 0; q < replicas; ++q) std::memcpy(buf[q] + i, acc, m * sizeof(E));
  }
}

template <class E>
void hand_blocked_all_reduce(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(E));
  bench::buffers<E> buf(replicas, n);
  bench::team_loop(state, replicas, [&](int r) {
    if (replicas < 8) {
      hand_blocked_step<E, 4096>(buf, r);
    } else {
      hand_blocked_step<E, 8192>(buf, r);
    }
  });
  data_counter(state, replicas, n * sizeof(E));
}

template <class E>
void copy_kernel(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(E));
  bench::buffers<E> src(replicas, n), dst(replicas, n);
  bench::team_loop(state, replicas, [&](int r) {
    const auto [lo, hi] = bench::chunk<E>(n, r, replicas);
    if (lo < hi) {
      for (int q = 0; q < replicas; ++q) std::memcpy(dst[q] + lo, src[q] + lo, (hi - lo) * sizeof(E));
    }
  });
  data_counter(state, replicas, n * sizeof(E));
}

void in_place_bound(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(16, bytes / sizeof(float));
  bench::buffers<float> buf(replicas, n);
  bench::team_loop(state, replicas, [&](int r) { bench::in_place_step(buf, r); });
  data_counter(state, replicas, n * sizeof(float));
}

template <class E>
void add_all(const std::vector<int>& replica_counts, const std::vector<std::size_t>& sizes, bool fallbacks,
             bool baselines, bool with_default = true) {
  using namespace mirror::ops;
  for (int r : replica_counts) {
    for (std::size_t b : sizes) {
      auto nm = [&](const char* impl) { return bench::name("all_reduce", impl, bench::type_name<E>, r, b); };
      if (with_default) {
        bench::add(nm("default"), [=](benchmark::State& s) { mirror_all_reduce<ChunkOwnerAllReduce, E>(s, r, b); });
      }
      if (fallbacks) {
        bench::add(nm("one_device"), [=](benchmark::State& s) { mirror_all_reduce<ReductionToOneDevice, E>(s, r, b); });
        bench::add(nm("hierarchical"), [=](benchmark::State& s) { mirror_all_reduce<HierarchicalCopy, E>(s, r, b); });
      }
      if (baselines) {
        bench::add(nm("naive"), [=](benchmark::State& s) { naive_all_reduce<E>(s, r, b); });
        bench::add(nm("hand_blocked"), [=](benchmark::State& s) { hand_blocked_all_reduce<E>(s, r, b); });
        if (b >= 4096) bench::add(nm("copy"), [=](benchmark::State& s) { copy_kernel<E>(s, r, b); });
      }
    }
  }
}

// mirror's default and hand_blocked only: the cells of the hand_blocked target that add_all's
// matrix lacks.
void add_blocked_pair(int r, std::size_t b) {
  auto nm = [&](const char* impl) { return bench::name("all_reduce", impl, bench::type_name<float>, r, b); };
  using mirror::ops::ChunkOwnerAllReduce;
  bench::add(nm("default"), [=](benchmark::State& s) { mirror_all_reduce<ChunkOwnerAllReduce, float>(s, r, b); });
  bench::add(nm("hand_blocked"), [=](benchmark::State& s) { hand_blocked_all_reduce<float>(s, r, b); });
}

}  // namespace

int main(int argc, char** argv) {
  return bench::main(argc, argv, "all_reduce", [] {
    constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
    // 2 replicas (one per core): every policy and baseline, from one float to 64 MiB.
    add_all<float>({2}, {4, 64, 4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB}, true, true);
    // Oversubscribed: 8 and 16 replicas on the same cores.
    add_all<float>({8, 16}, {4, 64 * KiB, MiB, 16 * MiB}, false, true);
    add_all<float>({8}, {16 * MiB}, true, false, false);  // the other policies (default: above)
    // The rest of the hand_blocked target's matrix, 2, 4, 8, 16 replicas x 1, 16, 64 MiB.
    for (std::size_t b : {MiB, 16 * MiB, 64 * MiB}) add_blocked_pair(4, b);
    for (int r : {8, 16}) add_blocked_pair(r, 64 * MiB);
    // The in-place bound at the sizes of the oversubscription targets.
    for (int r : {2, 8, 16}) {
      for (std::size_t b : {MiB, 16 * MiB}) {
        bench::add(bench::name("all_reduce", "in_place", bench::type_name<float>, r, b),
                   [=](benchmark::State& s) { in_place_bound(s, r, b); });
      }
    }
    // 2 replicas with the bytes in all of 8 or 16 replicas x 1 MiB and of 16 x 16 MiB: per byte
    // against those, oversubscription is compared at an equal working set (bench/report.py).
    add_all<float>({2}, {4 * MiB, 8 * MiB, 128 * MiB}, false, false);
    // Element types.
    add_all<double>({2}, {64 * KiB, 64 * MiB}, false, true);
    add_all<std::int32_t>({2}, {64 * KiB, 64 * MiB}, false, true);
  });
}
