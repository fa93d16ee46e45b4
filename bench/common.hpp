// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared harness of the benchmark programs (docs/design.md#benchmarks): the JSON context, the
// policy names, the nccl-tests bus bandwidth counter, and the hand-written std::thread team the
// baselines run on. Every program registers its benchmarks by name, with named axes
// (`verb/impl:X/type:T/replicas:R/bytes:S`), and also stores replicas and bytes as counters so
// that bench/report.py need not parse names.

#include <benchmark/benchmark.h>

#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>
#include <mirror/mirror.hpp>

#ifndef MIRROR_GIT_DESCRIBE
#define MIRROR_GIT_DESCRIBE "unknown"
#endif

namespace bench {

template <class Ops>
inline constexpr const char* policy_name = "?";
template <>
inline constexpr const char* policy_name<mirror::ops::ChunkOwnerAllReduce> = "default";
template <>
inline constexpr const char* policy_name<mirror::ops::ReductionToOneDevice> = "one_device";
template <>
inline constexpr const char* policy_name<mirror::ops::HierarchicalCopy> = "hierarchical";

template <class E>
inline constexpr const char* type_name = "?";
template <>
inline constexpr const char* type_name<float> = "float";
template <>
inline constexpr const char* type_name<double> = "double";
template <>
inline constexpr const char* type_name<std::int32_t> = "int32";

inline std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "g++ " __VERSION__;
#else
  return "unknown";
#endif
}

/// The context every program writes into its JSON ("context" object).
inline void add_context(const char* verb) {
  benchmark::AddCustomContext("verb", verb);
  benchmark::AddCustomContext("device", "devices::Threads (" + std::to_string(std::thread::hardware_concurrency()) +
                                            " hardware threads)");
  benchmark::AddCustomContext("policies", "default = ops::ChunkOwnerAllReduce, one_device = ops::ReductionToOneDevice, "
                                          "hierarchical = ops::HierarchicalCopy");
  benchmark::AddCustomContext("compiler", compiler());
  benchmark::AddCustomContext("git_describe", MIRROR_GIT_DESCRIBE);
}

/// `name/impl:I/type:T/replicas:R/bytes:S` (named axes).
inline std::string name(const char* verb, const std::string& impl, const char* type, int replicas, std::size_t bytes) {
  return std::string(verb) + "/impl:" + impl + "/type:" + type + "/replicas:" + std::to_string(replicas) +
         "/bytes:" + std::to_string(bytes);
}

/// bytes_per_second = algbw (bytes per replica / time) and busbw = algbw * 2(R-1)/R, as
/// nccl-tests computes them for all-reduce; replicas and bytes as plain counters.
inline void all_reduce_counters(benchmark::State& state, int replicas, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["busbw"] = benchmark::Counter(static_cast<double>(bytes) * 2.0 * (replicas - 1) / replicas,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["replicas"] = replicas;
  state.counters["bytes"] = static_cast<double>(bytes);
}

/// R buffers of `count` elements, 64-byte aligned, first touched (so page faults stay out of the
/// timed loop) with replica r's element i = r + (i % 7).
template <class E>
class buffers {
 public:
  buffers(int replicas, std::size_t count) : count_(count) {
    for (int r = 0; r < replicas; ++r) {
      data_.emplace_back(static_cast<E*>(::operator new(std::max<std::size_t>(count, 1) * sizeof(E), std::align_val_t{64})));
      E* p = data_.back().get();
      for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<E>(r + static_cast<int>(i % 7));
    }
  }
  E* operator[](int r) const noexcept { return data_[static_cast<std::size_t>(r)].get(); }
  std::size_t count() const noexcept { return count_; }
  int replicas() const noexcept { return static_cast<int>(data_.size()); }

 private:
  struct del {
    void operator()(E* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  std::size_t count_;
  std::vector<std::unique_ptr<E, del>> data_;
};

/// What a user writes without mirror: R-1 std::threads started for the job, the calling
/// thread as member 0, and a C++20 std::barrier between steps. f(r) runs on every member.
template <class F>
void team(int replicas, F&& f) {
  std::vector<std::jthread> others;
  others.reserve(static_cast<std::size_t>(replicas - 1));
  for (int r = 1; r < replicas; ++r) others.emplace_back([&f, r] { f(r); });
  f(0);
}

/// Part r of `parts` of [0, n), on 64-byte boundaries (the same split mirror uses).
template <class E>
std::pair<std::size_t, std::size_t> chunk(std::size_t n, int r, int parts) {
  constexpr std::size_t line = 64 / sizeof(E);
  std::size_t per = (n + static_cast<std::size_t>(parts) - 1) / static_cast<std::size_t>(parts);
  per = (per + line - 1) / line * line;
  const std::size_t lo = std::min(n, per * static_cast<std::size_t>(r));
  return {lo, std::min(n, lo + per)};
}

/// The in-place bound's step for member r of a team on `buf`: r's 1/R (chunk) of every buffer
/// read and rewritten once, in 16-byte vectors, each element plus 1 (not an identity GCC may
/// fold away: the loads and stores stay). The memory traffic of an in-place all-reduce and
/// nothing else: 2*R*S bytes per step. `buf` holds at least 16 floats per buffer.
inline void in_place_step(const buffers<float>& buf, int r) {
  typedef float group __attribute__((vector_size(16)));  // 4 floats; chunks are whole lines
  const int replicas = buf.replicas();
  const auto [lo, hi] = chunk<float>(buf.count(), r, replicas);
  for (int q = 0; q < replicas; ++q) {
    float* const p = buf[q];  // (a local: the stores could alias buf's own pointers)
    for (std::size_t i = lo; i + 4 <= hi; i += 4) {
      group v;
      std::memcpy(&v, p + i, sizeof v);
      v += 1.0f;
      std::memcpy(p + i, &v, sizeof v);
    }
  }
}

/// Runs `step(r)` `state.max_iterations` times on every member of a team, member 0 inside the
/// benchmark's timed loop, with a std::barrier after each step.
template <class Step>
void team_loop(benchmark::State& state, int replicas, Step&& step) {
  std::barrier sync(replicas);
  team(replicas, [&](int r) {
    if (r == 0) {
      for (auto _ : state) {
        step(0);
        sync.arrive_and_wait();
      }
    } else {
      for (benchmark::IterationCount i = 0; i < state.max_iterations; ++i) {
        step(r);
        sync.arrive_and_wait();
      }
    }
  });
}

/// Runs `step(ctx)` `state.max_iterations` times on every replica inside one Strategy::run,
/// replica 0 inside the benchmark's timed loop: the cost of a collective inside a running fn.
template <class Strategy, class Step>
void replica_loop(benchmark::State& state, Strategy& strategy, Step&& step) {
  strategy.run([&](auto& ctx) {
    if (ctx.replica_id_in_sync_group() == 0) {
      for (auto _ : state) step(ctx);
    } else {
      for (benchmark::IterationCount i = 0; i < state.max_iterations; ++i) step(ctx);
    }
  });
}

/// Registers with real time (the work is on several threads) and returns the benchmark.
template <class F>
benchmark::internal::Benchmark* add(const std::string& n, F&& f) {
  return benchmark::RegisterBenchmark(n.c_str(), std::forward<F>(f))->UseRealTime();
}

/// main(): context, then the registrations of `register_all`, then the run.
template <class Register>
int main(int argc, char** argv, const char* verb, Register&& register_all) {
  add_context(verb);
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace bench
