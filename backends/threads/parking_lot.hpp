// SPDX-License-Identifier: Apache-2.0
#pragma once
// Spin-then-park waiting. A waiter spins briefly (a collective's partners are usually a few
// hundred nanoseconds away), then yields, then sleeps on a condition variable, so more replicas
// than cores still make progress and an idle pool burns no CPU.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mirror::threads {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// One condition variable shared by every waiter of a runtime. `wake()` is cheap when nobody
/// sleeps (one atomic load), which is the common case while replicas spin.
class parking_lot {
 public:
  /// Spins tuned for the machine: long when every replica has a core, short when they share.
  void configure(int spins, int yields) noexcept {
    spins_ = spins;
    yields_ = yields;
  }

  /// Waits until `ready()` is true, or `deadline` passes (then returns false).
  template <class Ready>
  bool wait(Ready&& ready, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt) {
    for (int i = 0; i < spins_; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    for (int i = 0; i < yields_; ++i) {
      if (ready()) return true;
      std::this_thread::yield();
    }
    std::unique_lock lock(mutex_);
    // Either wake()'s read-modify-write of sleepers_ comes after this one in its modification
    // order (and sees a sleeper), or it comes before and this acquire synchronises with it, so
    // ready() below sees the state change. No fences: ThreadSanitizer can check this pairing.
    sleepers_.fetch_add(1, std::memory_order_acq_rel);
    bool ok = true;
    while (!ready()) {
      if (!deadline) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, *deadline) == std::cv_status::timeout && !ready()) {
        ok = false;
        break;
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_release);
    return ok;
  }

  /// Call after changing state a waiter may be waiting for.
  void wake() {
    // A read-modify-write, not a load: it releases the caller's state change to any waiter
    // that increments sleepers_ after it (see wait()).
    if (sleepers_.fetch_add(0, std::memory_order_acq_rel) == 0) return;
    { std::lock_guard lock(mutex_); }  // a sleeper is inside wait(), or has not yet tested ready()
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  int spins_ = 2000;
  int yields_ = 4;
};

}  // namespace mirror::threads
