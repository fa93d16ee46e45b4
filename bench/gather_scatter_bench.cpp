// SPDX-License-Identifier: Apache-2.0
// reduce_scatter and all_gather on one std::span<float> leaf per replica, inside a running fn,
// against hand-written baselines and memory bounds on the same sizes (R replicas, S bytes per
// replica's input):
//
// reduce_scatter (the sum, in place: replica r's cut of its own span receives cut r of the sum;
// cuts by the batch-split rule, S/R bytes each at these sizes):
//   impl:default|one_device|hierarchical  mirror, ctx.reduce_scatter(sum, std::span<float>) per step
//   impl:hand_blocked  what a careful programmer writes on std::thread with a std::barrier per
//                      step: each thread folds its cut from every replica's buffer in blocks that
//                      stay in L1 (memcpy replica 0's block into a local accumulator, add the
//                      others' with a loop GCC vectorises, replicas in order), then writes the
//                      block once into its own buffer; 4 KiB blocks below 8 replicas, 8 KiB from
//                      8 up (all_reduce_bench's hand_blocked, the fastest of 4-32 KiB there)
//   impl:in_place      the all-reduce in-place bound (all_reduce_bench): each thread reads and
//                      rewrites its 1/R of every buffer once, in 16-byte vectors
//   Bytes moved per step: reduce_scatter reads every replica's buffer once (R*S) and writes each
//   cut once (S): (R+1)*S. in_place reads and writes every buffer once: 2*R*S.
//
// all_gather (the span form: replica r's input of S bytes into its own output of R*S bytes, in
// replica order):
//   impl:default|one_device|hierarchical  mirror, ctx.all_gather(std::span<const float>,
//                      std::span<float>, axis0) per step
//   impl:hand_memcpy   on std::thread with a std::barrier per step: each thread memcpy's every
//                      replica's input into its own output, replica 0 first
//   impl:copy          the copy bound: the same memcpy calls (R of S bytes into one R*S output
//                      per thread), but from R inputs of the thread's own, so no read is shared
//                      between threads: a streaming copy of the same bytes and nothing else
//   Bytes moved per step: every replica reads R*S and writes R*S: 2*R*R*S, for all of them.
//   (In an all_gather every input is read by all R threads, and a thread may find a line in
//   the L3 another just read: hand_memcpy and mirror can beat the copy bound's time.)
//
// The counters: bytes_per_second = the bytes moved per step (above) per second, the figure
// compared between an implementation and its bound (bench/report.py computes the same from the
// time); moved = those bytes per step; replicas; bytes = S. Axes: impl, type, replicas, bytes.
#include <cstring>
#include "common.hpp"

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

/// Bytes one step moves (see the file comment).
std::size_t moved_bytes(bool gather, const std::string& impl, int replicas, std::size_t bytes) {
  const auto r = static_cast<std::size_t>(replicas);
  if (gather) return 2 * r * r * bytes;
  return impl == "in_place" ? 2 * r * bytes : (r + 1) * bytes;
}

void counters(benchmark::State& state, bool gather, const std::string& impl, int replicas, std::size_t bytes) {
  const std::size_t moved = moved_bytes(gather, impl, replicas, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(moved));
  state.counters["moved"] = static_cast<double>(moved);
  state.counters["replicas"] = replicas;
  state.counters["bytes"] = static_cast<double>(bytes);
}

/// Cut r of n elements among R: the batch-split rule (the first n mod R one element more).
std::pair<std::size_t, std::size_t> cut(std::size_t n, int r, int replicas) {
  const std::size_t per = n / static_cast<std::size_t>(replicas), extra = n % static_cast<std::size_t>(replicas);
  const auto u = static_cast<std::size_t>(r);
  return {u * per + std::min(u, extra), per + (u < extra ? 1 : 0)};
}

// ---- reduce_scatter ----

template <class Ops>
void mirror_reduce_scatter(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  bench::buffers<float> buf(replicas, n);
  mirror::Strategy<mirror::devices::Threads, Ops> strategy({.replicas = replicas});
  bench::replica_loop(state, strategy, [&](auto& ctx) {
    auto mine = ctx.reduce_scatter(mirror::ReduceOp::sum, std::span<float>(buf[ctx.replica_id_in_sync_group()], n));
    benchmark::DoNotOptimize(mine.data());
  });
  counters(state, false, bench::policy_name<Ops>, replicas, n * sizeof(float));
}

template <std::size_t BlockBytes>
void hand_blocked_step(const bench::buffers<float>& buf, int r) {
  constexpr std::size_t block = BlockBytes / sizeof(float);
  const int replicas = buf.replicas();
  const auto [first, count] = cut(buf.count(), r, replicas);
  alignas(64) float acc[block];
  for (std::size_t i = first; i < first + count; i += block) {
    const std::size_t m = std::min(block, first + count - i);
    std::memcpy(acc, buf[0] + i, m * sizeof(float));
    for (int q = 1; q < replicas; ++q) {
      const float* __restrict src = buf[q] + i;
      if (m == block) {
        for (std::size_t j = 0; j < block; ++j) acc[j] += src[j];
      } else {
        for (std::size_t j = 0; j < m; ++j) acc[j] += src[j];
      }
    }
    std::memcpy(buf[r] + i, acc, m * sizeof(float));  // the cut, once
  }
}

void hand_blocked_reduce_scatter(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  bench::buffers<float> buf(replicas, n);
  bench::team_loop(state, replicas, [&](int r) {
    if (replicas < 8) {
      hand_blocked_step<4096>(buf, r);
    } else {
      hand_blocked_step<8192>(buf, r);
    }
  });
  counters(state, false, "hand_blocked", replicas, n * sizeof(float));
}

void in_place_bound(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(16, bytes / sizeof(float));
  bench::buffers<float> buf(replicas, n);
  bench::team_loop(state, replicas, [&](int r) { bench::in_place_step(buf, r); });
  counters(state, false, "in_place", replicas, n * sizeof(float));
}

// ---- all_gather ----

template <class Ops>
void mirror_all_gather(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  bench::buffers<float> in(replicas, n), out(replicas, n * static_cast<std::size_t>(replicas));
  mirror::Strategy<mirror::devices::Threads, Ops> strategy({.replicas = replicas});
  bench::replica_loop(state, strategy, [&](auto& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    ctx.all_gather(std::span<const float>(in[g], n), std::span<float>(out[g], out.count()), mirror::axis0);
  });
  counters(state, true, bench::policy_name<Ops>, replicas, n * sizeof(float));
}

void hand_memcpy_all_gather(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  bench::buffers<float> in(replicas, n), out(replicas, n * static_cast<std::size_t>(replicas));
  bench::team_loop(state, replicas, [&](int r) {
    for (int q = 0; q < replicas; ++q) std::memcpy(out[r] + static_cast<std::size_t>(q) * n, in[q], n * sizeof(float));
  });
  counters(state, true, "hand_memcpy", replicas, n * sizeof(float));
}

void copy_bound(benchmark::State& state, int replicas, std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  const auto rs = static_cast<std::size_t>(replicas);
  // Thread r's own R inputs: part q of src[r].
  bench::buffers<float> src(replicas, n * rs), out(replicas, n * rs);
  bench::team_loop(state, replicas, [&](int r) {
    for (std::size_t q = 0; q < rs; ++q) std::memcpy(out[r] + q * n, src[r] + q * n, n * sizeof(float));
  });
  counters(state, true, "copy", replicas, n * sizeof(float));
}

void add_cell(int r, std::size_t b) {
  using namespace mirror::ops;
  auto rs = [&](const char* impl) { return bench::name("reduce_scatter", impl, "float", r, b); };
  auto ag = [&](const char* impl) { return bench::name("all_gather", impl, "float", r, b); };
  bench::add(rs("default"), [=](benchmark::State& s) { mirror_reduce_scatter<ChunkOwnerAllReduce>(s, r, b); });
  bench::add(rs("one_device"), [=](benchmark::State& s) { mirror_reduce_scatter<ReductionToOneDevice>(s, r, b); });
  bench::add(rs("hierarchical"), [=](benchmark::State& s) { mirror_reduce_scatter<HierarchicalCopy>(s, r, b); });
  bench::add(rs("hand_blocked"), [=](benchmark::State& s) { hand_blocked_reduce_scatter(s, r, b); });
  bench::add(ag("default"), [=](benchmark::State& s) { mirror_all_gather<ChunkOwnerAllReduce>(s, r, b); });
  bench::add(ag("one_device"), [=](benchmark::State& s) { mirror_all_gather<ReductionToOneDevice>(s, r, b); });
  bench::add(ag("hierarchical"), [=](benchmark::State& s) { mirror_all_gather<HierarchicalCopy>(s, r, b); });
  bench::add(ag("hand_memcpy"), [=](benchmark::State& s) { hand_memcpy_all_gather(s, r, b); });
  if (b >= 64 * KiB) {  // the bounds: bandwidth figures
    bench::add(rs("in_place"), [=](benchmark::State& s) { in_place_bound(s, r, b); });
    bench::add(ag("copy"), [=](benchmark::State& s) { copy_bound(s, r, b); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  return bench::main(argc, argv, "gather_scatter", [] {
    for (std::size_t b : {std::size_t{4}, 64 * KiB, MiB, 16 * MiB, 64 * MiB}) add_cell(2, b);
    for (std::size_t b : {MiB, 16 * MiB}) add_cell(8, b);
  });
}
