// SPDX-License-Identifier: Apache-2.0
#pragma once
// Spin-then-park waiting. A waiter spins briefly (a collective's partners are usually a few
// hundred nanoseconds away; with more replicas than cores it does not spin, runtime::limit_cores),
// then yields, then sleeps on a condition variable, so more replicas than cores still make
// progress and an idle pool burns no CPU.
//
// Written on POSIX threads and clock_gettime rather than <mutex>, <condition_variable> and
// <chrono> (docs/design.md#compile-time).

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <type_traits>

namespace mirror::threads {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  // The builtin is _mm_pause() without <immintrin.h>, which declares every intrinsic up to
  // AVX-512 (docs/design.md#compile-time).
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// CLOCK_MONOTONIC in nanoseconds (what std::chrono::steady_clock::now() reads on Linux).
inline std::int64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// A seq_cst fence. ThreadSanitizer does not model fences (GCC 12 warns, -Wtsan); the pool
/// uses this one only to decide who wakes parked threads (parking_lot::wake's rule), never to
/// publish data, so what TSan checks is unaffected.
inline void seq_cst_fence() noexcept {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#endif
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif
}

/// One condition variable shared by every waiter of a runtime. `wake()` is cheap when nobody
/// sleeps (a read of a line only sleepers write), which is the common case while replicas
/// spin. Cache-line aligned, so that neighbouring lots and counters do not share lines with it.
class alignas(64) parking_lot {
 public:
  // (Not inlined: a runtime has three lots, and their set-up and tear-down, with the
  // constructor's clean-up copies, would be inlined three times into the runtime's constructor.)
  [[gnu::noinline]] parking_lot() noexcept {
    // Timed waits count on the monotonic clock: a change of the wall clock must not end a
    // collective's timeout early or stretch it.
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cv_, &attr);
    pthread_condattr_destroy(&attr);
  }
  parking_lot(const parking_lot&) = delete;
  parking_lot& operator=(const parking_lot&) = delete;
  [[gnu::noinline]] ~parking_lot() {
    pthread_cond_destroy(&cv_);
    pthread_mutex_destroy(&mutex_);
  }

  /// `wait`'s timeout for a wait that only its condition ends.
  static constexpr std::int64_t forever = -1;

  /// How long a waiter spins (nanoseconds), then how many times it yields, before it parks. The
  /// spin is bounded in time, not in pause instructions: `pause` costs 3 to 140 cycles depending
  /// on the CPU, so a count tuned on one machine is 40x off on another.
  /// Safe while threads wait (each wait reads both once, as it starts).
  void configure(int spin_ns, int yields) noexcept {
    spin_ns_.store(spin_ns, std::memory_order_relaxed);
    yields_.store(yields, std::memory_order_relaxed);
  }

  /// Waits until the condition holds, or `timeout_ns` (counted from when the waiter parks; or
  /// `forever`) passes; then returns false. While spinning and yielding only the cheap
  /// `spin_ready()` is polled (so a spinner keeps no line that other threads write in shared
  /// state); `ready()`, which must include every condition a waker signals and read it with
  /// seq_cst loads (wake()'s rule), decides once the waiter parks. Neither may throw (the lot's
  /// mutex is held around `ready()`).
  template <class SpinReady, class Ready>
  bool wait(SpinReady&& spin_ready, Ready&& ready, std::int64_t timeout_ns) {
    // The first round of polls inline, where a partner on its own core usually arrives; the
    // rest, slow anyway, is one function for every condition (the conditions called through
    // pointers there), not a copy of the spin, yield and park code per wait.
    if (spin_ns_.load(std::memory_order_relaxed) > 0) {
      for (int i = 0; i < polls_per_round; ++i) {
        if (spin_ready()) return true;
        cpu_relax();
      }
    }
    return wait_slowly({&call<SpinReady>, &spin_ready}, {&call<Ready>, &ready}, timeout_ns);
  }

  /// Call after changing state a waiter may be waiting for. The rule: make the change with a
  /// seq_cst store or read-modify-write (or any store followed by seq_cst_fence()), and let the
  /// waiters' `ready()` read it with seq_cst loads (see wait()). Then this is a plain read of a
  /// line that nobody writes while nobody parks: no cache-line hand-off on the spinning fast
  /// path (a read-modify-write here cost one per wake-up, on every fork, barrier and join).
  void wake() {
    if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
    // A sleeper is inside wait(), or has not yet tested ready(): once this thread has held the
    // mutex, it is asleep on the condition variable, or will see the change.
    pthread_mutex_lock(&mutex_);
    pthread_mutex_unlock(&mutex_);
    pthread_cond_broadcast(&cv_);
  }

  /// How many waiters are parked (asleep on the condition variable, or about to be).
  int sleepers() const noexcept { return sleepers_.load(std::memory_order_acquire); }

 private:
  static constexpr int polls_per_round = 16;

  // A condition of wait() behind a pointer.
  struct condition {
    bool (*test)(void* f);
    void* f;
    bool operator()() const { return test(f); }
  };
  template <class F>
  static bool call(void* f) {
    return (*static_cast<std::remove_reference_t<F>*>(f))();
  }

  // wait() after its first round of polls: spin (time-bounded), yield, park.
  [[gnu::noinline]] bool wait_slowly(condition spin_ready, condition ready, std::int64_t timeout_ns) {
    const std::int64_t spin_ns = spin_ns_.load(std::memory_order_relaxed);
    const int yields = yields_.load(std::memory_order_relaxed);
    if (spin_ns > 0) {
      // Pure spinning for the first microseconds (where a partner on its own core arrives);
      // after that, a yield between polls: when the machine is loaded by other processes, the
      // partner may be queued behind this very spinner on its core, and only a yield (or
      // parking) lets it run. On an idle core the yield returns at once.
      constexpr std::int64_t pure_ns = 2'000;
      // The clock is first read after the first round of polls (wait()), and the spin counted
      // from there: under a hypervisor reading it costs about a cache-line hand-off, and a
      // partner on its own core is often that close.
      const std::int64_t start = monotonic_ns();
      for (;;) {
        for (int i = 0; i < polls_per_round; ++i) {
          if (spin_ready()) return true;
          cpu_relax();
        }
        const std::int64_t spent = monotonic_ns() - start;
        if (spent >= spin_ns) break;
        if (spent >= pure_ns) sched_yield();
      }
    }
    for (int i = 0; i < yields; ++i) {
      if (spin_ready()) return true;
      sched_yield();
    }
    timespec deadline{};
    if (timeout_ns != forever) {
      const std::int64_t at = monotonic_ns() + timeout_ns;
      deadline.tv_sec = static_cast<time_t>(at / 1'000'000'000);
      deadline.tv_nsec = static_cast<long>(at % 1'000'000'000);
    }
    pthread_mutex_lock(&mutex_);
    // The rule wake() states: this increment, the waker's state change (or its fence), its read
    // of sleepers_ and ready()'s reads are all seq_cst, so they fall in one total order. Either
    // the waker's read comes after this increment (and it notifies, under the mutex this thread
    // holds until it sleeps), or before it, and then so did the state change, which ready()
    // therefore sees.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    bool ok = true;
    while (!ready()) {
      if (timeout_ns == forever) {
        pthread_cond_wait(&cv_, &mutex_);
      } else if (pthread_cond_timedwait(&cv_, &mutex_, &deadline) == ETIMEDOUT && !ready()) {
        ok = false;
        break;
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_release);
    pthread_mutex_unlock(&mutex_);
    return ok;
  }

  // Line 1: what every wait and wake touches. The mutex and condition variable, touched only
  // when someone parks, follow on their own lines.
  std::atomic<int> sleepers_{0};
  std::atomic<int> yields_{4};
  // (ints: the pool's atomics keep to two types, int and std::uint64_t, since every header-only
  // translation unit compiles each type's atomic members; docs/design.md#compile-time.)
  std::atomic<int> spin_ns_{50'000};
  alignas(64) pthread_mutex_t mutex_ = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv_;
};

}  // namespace mirror::threads
