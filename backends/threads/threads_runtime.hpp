// SPDX-License-Identifier: Apache-2.0
#pragma once
// The runtime of devices::Threads: a persistent pool (replica 0 is the calling thread, replicas
// 1..R-1 are workers created once), a barrier that names the replicas that did not arrive, and
// fixed-stride exchange slots. Models mirror::device_runtime (mirror/concepts/device.hpp).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <atomic>
#include <cstddef>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>
#include <backends/threads/parking_lot.hpp>
#include <backends/threads/usable_cores.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/exchanged.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/error.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::threads {

class runtime {
 public:
  template <class E>
  using pointer = E*;
  static constexpr bool host_addressable = true;
  /// Largest payload `exchange` carries (a collective header plus one cache line of data).
  static constexpr std::size_t max_exchange_bytes = 192;

  runtime(int replicas, std::chrono::milliseconds timeout);

  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  ~runtime();

  int num_replicas() const noexcept { return n_; }

  /// How many cores the pool may use (default: the process's affinity mask, usable_cores()).
  /// A launcher that runs several processes on one host tells each its share
  /// (devices::Cluster does). May be called while the pool is idle or running.
  void limit_cores(unsigned cores) noexcept;

  /// True on a thread that is running a replica function of this runtime.
  bool in_parallel() const noexcept { return current == this; }

  /// Calls f(r) for every replica r concurrently (r = 0 on the calling thread); returns when
  /// all have returned. f must not throw.
  template <class F>
  void parallel(F&& f) {
    static_assert(std::is_nothrow_invocable_v<F&, int>, "runtime::parallel(f): f(int) must be noexcept");
    run_job(&invoke<std::remove_reference_t<F>>, static_cast<void*>(std::addressof(f)));
  }

  /// Makes every waiting and later exchange/barrier of the current parallel call throw
  /// detail::collective_cancelled.
  void cancel();

  /// All-gather of `payload` and a barrier.
  template <class P>
  detail::exchanged<P> exchange(int self, const P& payload) {
    static_assert(std::is_trivially_copyable_v<P>, "exchange payloads are copied as bytes");
    static_assert(sizeof(P) <= max_exchange_bytes && alignof(P) <= alignof(slot),
                  "exchange payload too large for the runtime's slots");
    per_replica& me = replica_[static_cast<std::size_t>(self)];
    const std::size_t parity = me.calls & 1u;
    std::memcpy(slots_[parity * static_cast<std::size_t>(n_) + static_cast<std::size_t>(self)].bytes, &payload,
                sizeof(P));
    arrive(self);
    return detail::exchanged<P>(slots_[parity * static_cast<std::size_t>(n_)].bytes, sizeof(slot),
                                static_cast<std::size_t>(n_));
  }

  void barrier(int self) { arrive(self); }

  // ---- memory: host memory shared by every replica ----
  template <class E>
  E* attach(int, std::span<E> host) const noexcept {
    return host.data();
  }
  template <class E>
  void detach(int, E*, std::span<E>) const noexcept {}

  template <class E>
  E* scratch(int self, std::size_t n) {
    per_replica& me = replica_[static_cast<std::size_t>(self)];
    const std::size_t bytes = std::max<std::size_t>(n * sizeof(E), 64);
    me.scratch_peak = std::max(me.scratch_peak, bytes);
    if (bytes > me.scratch_bytes) {
      me.scratch.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64})));
      me.scratch_bytes = bytes;
      ++me.scratch_allocations;
    }
    return reinterpret_cast<E*>(me.scratch.get());
  }

  /// Scratch memory the replicas hold between parallel calls, in bytes (call while none runs).
  std::size_t scratch_bytes() const noexcept;
  /// Never free scratch between parallel calls (see trim_scratch). devices::Cluster asks for it:
  /// there scratch stages cross-worker collectives, which Open MPI may still write into after a
  /// failure abandoned them (it cannot cancel them), until the strategy is destroyed.
  void keep_scratch() noexcept { trim_ = false; }

  /// How many times the replicas allocated scratch (a training loop's count stops growing).
  std::uint64_t scratch_allocations() const noexcept;

  template <class E>
  void copy(int, E* dst, const E* src, std::size_t n) const noexcept {
    if (dst != src && n != 0) std::memcpy(dst, src, n * sizeof(E));
  }
  template <class E>
  void combine(int, ReduceOp op, E* dst, const E* src, std::size_t n) const noexcept {
    detail::combine_into(op, dst, src, n);
  }
  template <class E>
  void divide(int, E* p, std::size_t n, std::size_t count) const noexcept {
    detail::divide_all(p, n, count);
  }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  struct alignas(64) per_replica {
    std::size_t calls = 0;                           // exchanges + barriers in this parallel call
    std::atomic<std::uint64_t> arrived_at{0};         // last barrier generation reached (+1)
    std::atomic<std::uint64_t> finished{0};           // epoch of the last parallel call whose f returned
    std::unique_ptr<std::byte, aligned_delete> scratch;
    std::size_t scratch_bytes = 0;
    std::size_t scratch_peak = 0;  // the largest request since the last trim (trim_scratch)
    std::uint64_t scratch_allocations = 0;
  };
  struct alignas(64) slot {
    unsigned char bytes[max_exchange_bytes];
  };

  template <class F>
  static void invoke(void* f, int r) noexcept {
    (*static_cast<F*>(f))(r);
  }

  // The part of parallel() that does not depend on f (the spin-then-park wait for the workers
  // above all): one copy, instead of one per replica function.
  void run_job(void (*job)(void*, int) noexcept, void* arg);

  void run_one(int r) noexcept;

  void work(int r);

  // Scratch grows to the largest request and is kept, so a training loop's collectives allocate
  // once. Every `trim_period` parallel calls, a replica whose largest request in that window
  // was under a quarter of what it holds (none at all, or small ones after a one-off large
  // collective: an initial broadcast, a final reduce of a whole model) frees it; its next
  // request allocates what it needs. Called while no replica runs (they touch only their own
  // scratch, and the last parallel call's end ordered their writes before this).
  static constexpr std::uint64_t trim_period = 16;
  void trim_scratch() noexcept;

  // Only called while no replica runs, so relaxed stores suffice (job_seq_'s release publishes
  // them). A call whose barriers all opened leaves nothing to reset: generations keep counting
  // across calls, `finished` is compared with the epoch, and each replica resets its own count
  // in run_one. Only a call that ended in a half-full barrier (an error) needs a reset, and then
  // a fresh generation, so no replica's arrived_at from it matches the next call's barriers.
  void reset_collectives() noexcept;

  void arrive(int self);

  // The message of arrive()'s timeout_error, out of line: arrive() is on every collective's path.
  [[noreturn]] void throw_timeout(int self, bool woke, std::vector<int> missing) const;

  inline static thread_local const runtime* current = nullptr;

  const int n_;
  const std::chrono::milliseconds timeout_;
  // Separate lots, so that an event wakes only the threads waiting for it: idle workers (a new
  // job), the caller (all done), replicas in a barrier (it opened, was cancelled, or a replica
  // finished without reaching it).
  parking_lot job_lot_, done_lot_, barrier_lot_;
  std::unique_ptr<per_replica[]> replica_;
  std::unique_ptr<slot[]> slots_;
  std::unique_ptr<std::thread[]> workers_;  // replicas 1..n-1 (an array: no vector growth code per TU)

  // What a new job publishes, on one line: a worker reads it all after one miss.
  alignas(64) std::atomic<std::uint64_t> job_seq_{0};
  void (*job_)(void*, int) noexcept = nullptr;
  void* job_arg_ = nullptr;
  std::uint64_t epoch_ = 0;  // job_seq_ of the current parallel call
  std::uint64_t calls_since_trim_ = 0;  // parallel calls since trim_scratch last looked
  bool trim_ = true;                     // false after keep_scratch()
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> arrived_{0};
  // What barrier spinners poll, on one line, written only when a barrier opens or is cancelled.
  alignas(64) std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> stop_{false};
};

// The members that do not depend on a replica function or an element type: compiled in every
// translation unit when header-only, once in libmirror_threads with MIRROR_SEPARATE_COMPILATION
// (mirror/detail/separate_compilation.hpp).
#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE runtime::runtime(int replicas, std::chrono::milliseconds timeout)
    : n_(replicas), timeout_(timeout) {
  if (replicas < 1) {
    throw std::invalid_argument(detail::format(
        "mirror::devices::Threads{.replicas = %d}: replicas must be >= 1 (it may exceed the number of cores)",
        replicas));
  }
  if (timeout.count() <= 0) {
    throw std::invalid_argument("mirror::devices::Threads{.timeout}: the collective timeout must be positive");
  }
  limit_cores(usable_cores());
  replica_ = std::make_unique<per_replica[]>(static_cast<std::size_t>(n_));
  slots_ = std::make_unique<slot[]>(2 * static_cast<std::size_t>(n_));
  workers_ = std::make_unique<std::thread[]>(static_cast<std::size_t>(n_ - 1));
  for (int r = 1; r < n_; ++r) workers_[static_cast<std::size_t>(r - 1)] = std::thread([this, r] { work(r); });
}

MIRROR_DETAIL_INLINE runtime::~runtime() {
  stop_.store(true, std::memory_order_release);
  job_seq_.fetch_add(1, std::memory_order_acq_rel);
  job_lot_.wake();
  for (int r = 1; r < n_; ++r) workers_[static_cast<std::size_t>(r - 1)].join();
}

MIRROR_DETAIL_INLINE void runtime::limit_cores(unsigned cores) noexcept {
  // Spinning only pays when every replica has a core; oversubscribed, a spinner steals the
  // time slice of the replica it waits for. With a core each, the spin (pure for 2 us, then
  // yielding) should outlast a training step's imbalance between replicas: a parked waiter
  // costs the late replica, the one on the critical path, a futex wake-up, and itself a
  // scheduler wake-up. Fashion-MNIST, 2 replicas on 2 cores (a VM whose steps jitter by
  // hundreds of us): a 100 us spin parked in half of the steps' all-reduce barriers, 300 us in
  // a third, 1 ms in 4 of 470; 2 replicas vs 1 went from 1.30-1.68x to 1.61-1.80x (4
  // alternated rounds). The pool parks after it, so an idle pool burns nothing.
  for (parking_lot* lot : {&job_lot_, &done_lot_, &barrier_lot_}) {
    if (static_cast<unsigned>(n_) <= cores) {
      lot->configure(std::chrono::milliseconds(1), 8);
    } else {
      lot->configure(std::chrono::microseconds(1), 2);
    }
  }
}

MIRROR_DETAIL_INLINE void runtime::cancel() {
  cancelled_.store(true, std::memory_order_release);
  barrier_lot_.wake();
}

MIRROR_DETAIL_INLINE std::size_t runtime::scratch_bytes() const noexcept {
  std::size_t total = 0;
  for (int r = 0; r < n_; ++r) total += replica_[static_cast<std::size_t>(r)].scratch_bytes;
  return total;
}

MIRROR_DETAIL_INLINE std::uint64_t runtime::scratch_allocations() const noexcept {
  std::uint64_t total = 0;
  for (int r = 0; r < n_; ++r) total += replica_[static_cast<std::size_t>(r)].scratch_allocations;
  return total;
}

MIRROR_DETAIL_INLINE void runtime::run_job(void (*job)(void*, int) noexcept, void* arg) {
  reset_collectives();
  trim_scratch();
  job_ = job;
  job_arg_ = arg;
  epoch_ = job_seq_.load(std::memory_order_relaxed) + 1;
  pending_.store(n_ - 1, std::memory_order_relaxed);
  job_seq_.store(epoch_, std::memory_order_release);
  job_lot_.wake();
  run_one(0);
  done_lot_.wait([&] { return pending_.load(std::memory_order_acquire) == 0; });
}

MIRROR_DETAIL_INLINE void runtime::run_one(int r) noexcept {
  per_replica& me = replica_[static_cast<std::size_t>(r)];
  me.calls = 0;  // only this replica reads its count, so it resets it (no line crosses cores)
  const runtime* outer = current;
  current = this;
  job_(job_arg_, r);
  current = outer;
  me.finished.store(epoch_, std::memory_order_seq_cst);
  // A replica waiting in a barrier may now know r will never arrive. Normally nobody waits
  // when a replica finishes (every barrier it reached has opened), so skip the wake-up; the
  // seq_cst pair with arrive()'s fetch_add means a waiter either is counted here or sees
  // `finished` before it parks.
  if (arrived_.load(std::memory_order_seq_cst) != 0) barrier_lot_.wake();
}

MIRROR_DETAIL_INLINE void runtime::work(int r) {
  std::uint64_t seen = 0;
  for (;;) {
    job_lot_.wait([&] { return job_seq_.load(std::memory_order_acquire) != seen; }, std::nullopt);
    seen = job_seq_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    run_one(r);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_lot_.wake();
  }
}

MIRROR_DETAIL_INLINE void runtime::trim_scratch() noexcept {
  if (!trim_ || ++calls_since_trim_ < trim_period) return;
  calls_since_trim_ = 0;
  for (int r = 0; r < n_; ++r) {
    per_replica& me = replica_[static_cast<std::size_t>(r)];
    if (me.scratch_peak < me.scratch_bytes / 4) {
      me.scratch.reset();
      me.scratch_bytes = 0;
    }
    me.scratch_peak = 0;
  }
}

MIRROR_DETAIL_INLINE void runtime::reset_collectives() noexcept {
  if (arrived_.load(std::memory_order_relaxed) != 0 || cancelled_.load(std::memory_order_relaxed)) {
    cancelled_.store(false, std::memory_order_relaxed);
    arrived_.store(0, std::memory_order_relaxed);
    generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
}

MIRROR_DETAIL_INLINE void runtime::arrive(int self) {
  per_replica& me = replica_[static_cast<std::size_t>(self)];
  ++me.calls;
  if (cancelled_.load(std::memory_order_acquire)) throw detail::collective_cancelled{};
  const std::uint64_t g = generation_.load(std::memory_order_acquire);
  me.arrived_at.store(g + 1, std::memory_order_relaxed);
  if (arrived_.fetch_add(1, std::memory_order_seq_cst) + 1 == n_) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.store(g + 1, std::memory_order_release);
    barrier_lot_.wake();
    return;
  }
  auto some_finished = [&] {
    for (int r = 0; r < n_; ++r) {
      if (replica_[static_cast<std::size_t>(r)].finished.load(std::memory_order_seq_cst) == epoch_) return true;
    }
    return false;
  };
  auto opened = [&] {
    return generation_.load(std::memory_order_acquire) != g || cancelled_.load(std::memory_order_acquire);
  };
  // Spinning polls only the generation's line; whether a replica returned without reaching
  // this barrier (which wakes parked waiters) is checked once parked.
  const bool woke = barrier_lot_.wait(opened, [&] { return opened() || some_finished(); },
                                      std::chrono::nanoseconds(timeout_));
  // Generation first: a replica finishes only after every barrier it reached has opened.
  if (generation_.load(std::memory_order_acquire) != g) return;
  if (cancelled_.load(std::memory_order_acquire)) throw detail::collective_cancelled{};
  std::vector<int> missing;
  for (int r = 0; r < n_; ++r) {
    const per_replica& p = replica_[static_cast<std::size_t>(r)];
    if (p.arrived_at.load(std::memory_order_acquire) != g + 1 &&
        (!woke || p.finished.load(std::memory_order_acquire) == epoch_)) {
      missing.push_back(r);
    }
  }
  throw_timeout(self, woke, std::move(missing));
}

MIRROR_DETAIL_INLINE void runtime::throw_timeout(int self, bool woke, std::vector<int> missing) const {
  std::string names;
  for (int r : missing) names += detail::format(names.empty() ? "%d" : ", %d", r);
  const per_replica& me = replica_[static_cast<std::size_t>(self)];
  throw timeout_error(
      woke ? detail::format("mirror: replica %d waits in collective call %zu that replicas {%s} returned from fn "
                            "without reaching; every replica must make the same collective calls",
                            self, me.calls, names.c_str())
           : detail::format("mirror: replica %d waited %lld ms in a collective that replicas {%s} did not reach; "
                            "raise devices::Threads{.timeout} if they are just slow",
                            self, static_cast<long long>(timeout_.count()), names.c_str()),
      std::move(missing));
}
#endif

}  // namespace mirror::threads
