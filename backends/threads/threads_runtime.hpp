// SPDX-License-Identifier: Apache-2.0
#pragma once
// The runtime of devices::Threads: a persistent pool (replica 0 is the calling thread, replicas
// 1..R-1 are workers created once), fixed-stride exchange slots whose arrival numbers are the
// barrier, and waits that name the replicas that did not arrive. Models mirror::device_runtime
// (mirror/concepts/device.hpp).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <pthread.h>
#include <sched.h>  // sched_yield
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>
#include <mirror/backends/threads/parking_lot.hpp>
#include <mirror/backends/threads/usable_cores.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/flight_recorder.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/backend/exchanged.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/error.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::threads {

/// The runtime of `devices::Threads`: a pool of one thread per replica (the caller is replica
/// 0), made once per `Strategy`, and the primitives the `mirror::device` concept asks for
/// (mirror/concepts/device.hpp). `Strategy::runtime()` returns it; programs rarely need more
/// than `scratch_bytes()` and `limit_cores()`.
class runtime {
 public:
  /// Replicas share the process's memory: a handle to a replica's buffer is a plain pointer.
  template <class E>
  using pointer = E*;
  static constexpr bool host_addressable = true;  ///< every replica's thread reads every buffer
  /// Largest payload `exchange` carries (a collective header plus one cache line of data).
  static constexpr std::size_t max_exchange_bytes = 192;

  /// Starts `replicas - 1` threads; collectives wait at most `timeout` for the other replicas.
  /// **Errors**: `backend_error` when a thread cannot be started.
  runtime(int replicas, std::chrono::milliseconds timeout);

  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  ~runtime();

  /// The replica count.
  int num_replicas() const noexcept { return n_; }

  /// How many cores the pool may use (default: the process's affinity mask, usable_cores()).
  /// A launcher that runs several processes on one host tells each its share
  /// (devices::Cluster does). May be called while the pool is idle or running.
  void limit_cores(unsigned cores) noexcept;

  ///@{
  /// The id that messages and `timeout_error::missing()` give local replica 0 (default 0): a
  /// runtime that is one worker's part of a multi-process strategy (devices::Cluster) numbers
  /// its replicas globally, w*R + r, as the user sees them.
  void number_replicas_from(int first) noexcept { first_id_ = first; }
  int first_replica() const noexcept { return first_id_; }
  ///@}

  /// True on a thread that is running a replica function of this runtime.
  bool in_parallel() const noexcept { return current == this; }

  /// How many of the worker threads (replicas 1..R-1) are parked waiting for the next parallel
  /// call: asleep, burning no CPU. An idle pool gets there after its spin (limit_cores).
  int parked_workers() const noexcept { return job_lot_.sleepers(); }

  /// Calls f(r) for every replica r concurrently (r = 0 on the calling thread); returns when
  /// all have returned. f must not throw. A small trivially copyable f whose call operator is
  /// const is called through a copy that every replica shares (so a `mutable` member it changes
  /// does not reach the caller's object).
  template <class F>
  void parallel(F&& f) {
    using Fn = std::remove_reference_t<F>;
    static_assert(std::is_nothrow_invocable_v<Fn&, int>, "runtime::parallel(f): f(int) must be noexcept");
    // A small closure (Strategy::run's holds three or four references) travels in the job line
    // itself, so a worker reads everything it needs to start with the one miss that tells it
    // there is a job, instead of a second one on the caller's stack (which the caller keeps
    // writing). Only closures whose call cannot change them: replicas share the one copy.
    if constexpr (std::is_trivially_copyable_v<Fn> && sizeof(Fn) <= job_line::data_bytes &&
                  alignof(Fn) <= alignof(std::uint64_t) && std::is_nothrow_invocable_v<const Fn&, int>) {
      ::new (static_cast<void*>(job_.data)) Fn(f);
      run_job(&invoke_inline<Fn>);
    } else {
      Fn* target = std::addressof(f);
      std::memcpy(job_.data, &target, sizeof target);
      run_job(&invoke_indirect<Fn>);
    }
  }

  /// Makes every waiting and later exchange/barrier of the current parallel call throw
  /// backend::collective_cancelled_rethrow_me (or the call's timeout_error, when a collective timed out).
  void cancel();

  /// Cancels as `cancel()` does, with `error` as what every waiting and later exchange/barrier of
  /// the current parallel call throws: an error one replica found for all of them
  /// (backend::collective::for_all_replicas). A timeout or error published first is kept.
  void fail_collective(std::exception_ptr error) noexcept;

  /// All-gather of `payload` and a barrier.
  template <class P>
  backend::exchanged<P> exchange(int self, const P& payload) {
    static_assert(std::is_trivially_copyable_v<P>, "exchange payloads are copied as bytes");
    static_assert(sizeof(P) <= max_exchange_bytes && alignof(P) <= alignof(slot_payload),
                  "exchange payload too large for the runtime's slots");
    // Every load of the payload before any store into the slot. The payload is usually a
    // temporary the caller has just built with stores of other widths than a copy's loads, so
    // a load may wait for those stores to reach the cache; with a store into the slot queued
    // ahead of them (its line is polled by the other replicas: a cross-core round trip away)
    // it would wait for that one too, and the others would see the slot's line written in
    // pieces, one round trip apart (bench/run_bench.cpp and the 4-byte all_reduce of
    // bench/all_reduce_bench.cpp measure it). Whole 16-byte groups, so exchange_groups copies
    // them as such.
    alignas(16) unsigned char bounce[(sizeof(P) + 15) / 16 * 16];
    std::memcpy(bounce, &payload, sizeof(P));
    return backend::exchanged<P>(exchange_groups(self, bounce, sizeof bounce / 16), sizeof(slot),
                                static_cast<std::size_t>(n_));
  }

  /// Waits until every replica of the current parallel call has arrived.
  void barrier(int self) {
    if (cancelled_.load(std::memory_order_acquire)) throw_cancelled();
    arrive(self);
  }

  // ---- memory: host memory shared by every replica ----
  ///@{
  /// The memory plane of the `device` concept: host buffers are used where they are, so these
  /// copy nothing.
  template <class E>
  E* attach(int, std::span<E> host) const noexcept {
    return host.data();
  }
  template <class E>
  void detach(int, E*, std::span<E>) const noexcept {}
  ///@}

  /// Replica `self`'s scratch space for `n` elements (64-byte aligned), grown when needed and
  /// valid until `self`'s next call; kept between runs unless later runs need far less.

  template <class E>
  E* scratch(int self, std::size_t n) {
    per_replica& me = replica_[static_cast<std::size_t>(self)];
    const std::size_t bytes = std::max<std::size_t>(n * sizeof(E), 64);
    me.scratch_peak = std::max(me.scratch_peak, bytes);
    if (bytes > me.scratch_bytes) {
      free_scratch(me);
      me.scratch = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64}));
      me.scratch_bytes = bytes;
      ++me.scratch_allocations;
    }
    return reinterpret_cast<E*>(me.scratch);
  }

  /// Room for a small value that replica `r` hands back from a parallel call: `result_bytes`,
  /// aligned to 16, on the line the caller reads to see that `r` finished, so returning a value
  /// costs no cache-line hand-off of its own (the caller reads it after parallel() returned;
  /// the next parallel call may overwrite it). Strategy::run keeps its replicas' results here.
  static constexpr std::size_t result_bytes = 48;
  /// Replica `r`'s `result_bytes` (see above).
  void* result_area(int r) noexcept { return replica_[static_cast<std::size_t>(r)].result; }

  /// Scratch memory the replicas hold between parallel calls, in bytes (call while none runs).
  std::size_t scratch_bytes() const noexcept;
  /// Never free scratch between parallel calls (see trim_scratch). devices::Cluster asks for it:
  /// there scratch stages cross-worker collectives, which Open MPI may still write into after a
  /// failure abandoned them (it cannot cancel them), until the strategy is destroyed.
  void keep_scratch() noexcept { trim_ = false; }

  /// How many times the replicas allocated scratch (a training loop's count stops growing).
  std::uint64_t scratch_allocations() const noexcept;

  ///@{
  /// The copy, combine and divide primitives of the `device` concept, on host memory
  /// (`combine` and `divide` through the vectorised element kernels).
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
  ///@}

 private:
  // How the pool synchronises, and why this way. A fork, a small exchange and a join each cost at
  // least one cache-line hand-off between cores (bench/handoff_bench.cpp measures one), and a run
  // with a 1-float all_reduce needs three in series: the job reaching a worker, the late replica's
  // payload reaching the early one, the worker's "finished" reaching the caller. So every wait
  // polls one line that exactly one other thread writes, and the data it then needs is on that
  // line:
  // - the job line carries the job (and a small closure) with its sequence number;
  // - each exchange slot carries its replica's payload with the arrival number that publishes
  //   it (no shared arrival counter: a read-modify-write of a counter line that every replica
  //   writes costs a hand-off of its own before anyone can see the barrier open);
  // - each replica's line carries the epoch of the last call it finished.
  // Waking parked threads costs a read of a line nobody writes while nobody parks
  // (parking_lot::wake), so the spinning fast path pays nothing for it.

  struct alignas(64) per_replica {
    // Line 0: what the caller reads when the replica finished.
    std::atomic<std::uint64_t> finished{0};  // epoch of the last parallel call whose f returned
    // Exchanges + barriers this replica entered in the current call. Written only by it; the
    // caller reads it after the join (to number the next call's arrivals above these).
    std::uint64_t calls = 0;
    alignas(16) unsigned char result[result_bytes];  // result_area()
    // Line 1: the replica's scratch, touched by others only between calls; and what its worker
    // thread reads once, as it starts.
    std::byte* scratch = nullptr;  // ::operator new(scratch_bytes, align 64); free_scratch()
    std::size_t scratch_bytes = 0;
    std::size_t scratch_peak = 0;  // the largest request since the last trim (trim_scratch)
    std::uint64_t scratch_allocations = 0;
    runtime* owner = nullptr;
    int index = 0;
  };
  struct alignas(16) slot_payload {
    unsigned char bytes[max_exchange_bytes];
  };
  // One replica's exchange slot: the arrival number (base + call) publishes the payload after
  // it; the first 48 payload bytes share its line. Two rows (by the parity of the call) let a
  // replica write its next payload while a slower one still reads this one: it can be two calls
  // ahead only after everyone arrived at the call in between, having finished reading.
  struct alignas(64) slot {
    std::atomic<std::uint64_t> arrived{0};
    slot_payload payload;
  };
  // What a new job publishes, on one line: `seq` last. `run == nullptr` asks the workers to stop.
  struct alignas(64) job_line {
    static constexpr std::size_t data_bytes = 40;
    std::atomic<std::uint64_t> seq{0};              // the epoch of the current parallel call
    void (*run)(const void*, int) noexcept = nullptr;
    std::uint64_t base = 0;                         // this call's arrival numbers are base + 1, + 2, ...
    alignas(std::uint64_t) unsigned char data[data_bytes];  // the closure, or a pointer to it
  };
  static_assert(sizeof(job_line) == 64, "the job line is one cache line");

  template <class Fn>
  static void invoke_inline(const void* data, int r) noexcept {
    (*std::launder(static_cast<const Fn*>(data)))(r);
  }
  template <class Fn>
  static void invoke_indirect(const void* data, int r) noexcept {
    Fn* target;
    std::memcpy(&target, data, sizeof target);
    (*target)(r);
  }

  slot* row_of(std::uint64_t call) const noexcept {
    return slots_ + (call & 1u) * static_cast<std::size_t>(n_);
  }

  // The part of parallel() that does not depend on f (the spin-then-park wait for the workers
  // above all): one copy, instead of one per replica function.
  void run_job(void (*job)(const void*, int) noexcept);

  // The part of exchange() that does not depend on the payload's type (one copy, not one per
  // payload type): publishes `groups` 16-byte groups of `bounce` in self's slot, arrives, and
  // returns replica 0's payload (the others follow at a stride of sizeof(slot)).
  const unsigned char* exchange_groups(int self, const unsigned char* bounce, std::size_t groups);

  void run_one(int r) noexcept;

  // Whether every worker from `from` on has finished the call `epoch`; advances `from` past
  // those that have (a waiter's later looks skip them).
  bool workers_finished(std::uint64_t epoch, int& from, std::memory_order order) const noexcept {
    for (; from < n_; ++from) {
      if (replica_[static_cast<std::size_t>(from)].finished.load(order) != epoch) return false;
    }
    return true;
  }

  void work(int r);
  static void* worker_main(void* replica) noexcept;
  [[noreturn, gnu::cold]] static void throw_invalid_argument(int replicas);
  // Stops the workers started before `replica`'s, frees, and throws the backend_error.
  [[noreturn, gnu::cold]] void abandon_start(int replica, int failed);
  // Tells workers 1..created to stop, joins them and frees what the constructor allocated.
  void shut_down(int created) noexcept;
  static void free_scratch(per_replica& me) noexcept;

  // Scratch grows to the largest request and is kept, so a training loop's collectives allocate
  // once. Every `trim_period` parallel calls, a replica whose largest request in that window
  // was under a quarter of what it holds (none at all, or small ones after a one-off large
  // collective: an initial broadcast, a final reduce of a whole model) frees it; its next
  // request allocates what it needs. Called while no replica runs (they touch only their own
  // scratch, and the last parallel call's end ordered their writes before this).
  static constexpr std::uint64_t trim_period = 16;
  void trim_scratch() noexcept;

  // Publishes self's arrival at its next collective and waits for the others. Its callers,
  // exchange() and barrier(), have looked at cancelled_ already (exchange before it writes the
  // payload), so arrive() does not look again before it publishes.
  void arrive(int self);

  // A timed-out collective ends the collectives of the parallel call: its timeout_error is kept
  // and every pending or later exchange/barrier of the call throws it. Without that, a replica
  // that caught the error inside fn and went on would leave its arrival in a slot that a late
  // replica then takes for this collective's, and the two would pair different collectives.
  // One replica claims the failure and builds the error; every other replica that times out,
  // or is cancelled, rethrows that same object (rethrow_failure), never one of its own: a
  // replica listing the missing after the claimant's cancel() would count replicas that were
  // only cancelled as missing. The message is built out of line: arrive() is on every
  // collective's path.
  [[noreturn, gnu::cold]] void throw_timeout(int self, bool woke, std::uint64_t number, std::uint64_t epoch);
  // Makes `error` the parallel call's failure unless one was claimed first (true if it was not):
  // what rethrow_failure throws on every replica. The caller then cancels.
  bool claim_failure(std::exception_ptr error) noexcept;
  // What an exchange/barrier of a cancelled call throws.
  [[noreturn, gnu::cold]] void throw_cancelled() const;
  // The claimed failure, once its claimant has published it (state 1 lasts as long as it takes
  // the claimant to build the error; nothing else can happen in between).
  [[noreturn, gnu::cold]] void rethrow_failure() const;

  inline static thread_local const runtime* current = nullptr;

  const int n_;
  const std::int64_t timeout_ns_;  // a collective's wait for the others (devices::Threads{.timeout})
  // Separate lots, so that an event wakes only the threads waiting for it: idle workers (a new
  // job), the caller (all done), replicas in a barrier (it opened, was cancelled, or a replica
  // finished without reaching it).
  parking_lot job_lot_, done_lot_, barrier_lot_;
  // Arrays owned here, not by std::unique_ptr or std::thread (docs/design.md#compile-time).
  // One block, which replica_ starts (the constructor).
  per_replica* replica_ = nullptr;  // n_
  slot* slots_ = nullptr;           // 2 rows of n_
  pthread_t* workers_ = nullptr;    // replicas 1..n-1

  job_line job_;
  // Read by every arrival, written only by cancel() and the next call's start: its own line.
  alignas(64) std::atomic<int> cancelled_{0};  // 0 or 1 (an int: see parking_lot::spin_ns_)
  // The call's timeout_error (throw_timeout): claimed (1), then published (2) before cancelled_.
  // Once claimed, every replica's error of the call is that one (rethrow_failure).
  std::atomic<int> failure_state_{0};
  std::exception_ptr failure_;
  // The caller's own bookkeeping between calls.
  alignas(64) std::uint64_t next_base_ = 0;  // above every arrival number used so far
  std::uint64_t calls_since_trim_ = 0;        // parallel calls since trim_scratch last looked
  bool trim_ = true;                          // false after keep_scratch()
  int first_id_ = 0;                          // number_replicas_from
};

// The members that do not depend on a replica function or an element type: compiled in every
// translation unit when header-only, once in libmirror_threads with MIRROR_SEPARATE_COMPILATION
// (mirror/detail/separate_compilation.hpp).
#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE runtime::runtime(int replicas, std::chrono::milliseconds timeout)
    // (In nanoseconds, capped at a century so that a deadline never overflows.)
    : n_(replicas), timeout_ns_(std::min<std::int64_t>(timeout.count(), 3'155'760'000'000) * 1'000'000) {
  if (replicas < 1 || timeout.count() <= 0) throw_invalid_argument(replicas);
  limit_cores(usable_cores());
  // One block for the replicas' lines, the two rows of slots and the worker handles (all
  // trivially destructible): nothing to release if the allocation throws, and no new[]
  // bookkeeping (three arrays and their clean-up code).
  const auto n = static_cast<std::size_t>(n_);
  void* const block =
      ::operator new(n * sizeof(per_replica) + 2 * n * sizeof(slot) + (n - 1) * sizeof(pthread_t), std::align_val_t{64});
  replica_ = static_cast<per_replica*>(block);
  slots_ = reinterpret_cast<slot*>(replica_ + n);
  workers_ = reinterpret_cast<pthread_t*>(slots_ + 2 * n);
  for (std::size_t r = 0; r < n; ++r) {
    per_replica* const me = ::new (static_cast<void*>(replica_ + r)) per_replica{};
    me->owner = this;
    me->index = static_cast<int>(r);
  }
  for (std::size_t k = 0; k < 2 * n; ++k) ::new (static_cast<void*>(slots_ + k)) slot{};
  for (int r = 1; r < n_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const int failed = pthread_create(&workers_[i - 1], nullptr, &worker_main, &replica_[i]);
    if (failed != 0) abandon_start(r, failed);
  }
}

// The constructor's errors, out of it: what builds and throws them is compiled once, and the
// constructor (on no hot path, but in every header-only translation unit) carries no clean-up
// code for their messages.
MIRROR_DETAIL_INLINE void runtime::throw_invalid_argument(int replicas) {
  if (replicas < 1) {
    throw std::invalid_argument(
        detail::format(
            "mirror::devices::Threads{.replicas = %d}: replicas must be >= 1 (it may exceed the number of cores)",
            replicas)
            .c_str());
  }
  throw std::invalid_argument("mirror::devices::Threads{.timeout}: the collective timeout must be positive");
}

MIRROR_DETAIL_INLINE void runtime::abandon_start(int replica, int failed) {
  shut_down(replica - 1);
  throw backend_error(detail::format("mirror::devices::Threads{.replicas = %d}: cannot start the thread of "
                                     "replica %d (pthread_create: %s); lower .replicas or raise the "
                                     "process's thread limit (ulimit -u)",
                                     n_, replica, std::strerror(failed)),
                      failed);
}

MIRROR_DETAIL_INLINE runtime::~runtime() { shut_down(n_ - 1); }

MIRROR_DETAIL_INLINE void runtime::shut_down(int created) noexcept {
  job_.run = nullptr;
  job_.seq.store(job_.seq.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
  job_lot_.wake();
  for (int r = 1; r <= created; ++r) pthread_join(workers_[static_cast<std::size_t>(r - 1)], nullptr);
  for (int r = 0; r < n_; ++r) free_scratch(replica_[static_cast<std::size_t>(r)]);
  ::operator delete(replica_, std::align_val_t{64});  // the constructor's block
}

MIRROR_DETAIL_INLINE void* runtime::worker_main(void* replica) noexcept {
  const per_replica& me = *static_cast<const per_replica*>(replica);
  me.owner->work(me.index);
  return nullptr;
}

MIRROR_DETAIL_INLINE void runtime::free_scratch(per_replica& me) noexcept {
  ::operator delete(me.scratch, std::align_val_t{64});
  me.scratch = nullptr;
  me.scratch_bytes = 0;
}

MIRROR_DETAIL_INLINE void runtime::limit_cores(unsigned cores) noexcept {
  // With a core each, a waiter spins (pure for 2 us, then yielding) long enough to outlast a
  // training step's imbalance between replicas: a parked waiter costs the late replica, the one
  // on the critical path, a futex wake-up, and itself a scheduler wake-up. Shorter spins parked
  // in a large share of the Fashion-MNIST trainer's all-reduce barriers on a VM whose steps
  // jitter by hundreds of microseconds, and cost it part of its 2-replica speedup
  // (bench/fashion_mnist_scaling.sh measures it).
  //
  // Oversubscribed, a spinner steals the time slice of a replica queued on its core, perhaps the
  // one it waits for; so there a waiter does not spin at all. It yields, which runs the replicas
  // queued behind it, and parks after four yields; parking at once makes every wait a futex
  // sleep and wake-up, and spinning first made small collectives of 3 to 16 replicas on 2 cores
  // up to several times slower (bench/all_reduce_bench.cpp and bench/run_bench.cpp at 8 and 16
  // replicas measure it).
  //
  // Either way the pool parks in the end, so an idle pool burns nothing.
  for (parking_lot* lot : {&job_lot_, &done_lot_, &barrier_lot_}) {
    if (static_cast<unsigned>(n_) <= cores) {
      lot->configure(1'000'000, 8);  // 1 ms
    } else {
      lot->configure(0, 4);  // yield, yield, yield, yield, park
    }
  }
}

MIRROR_DETAIL_INLINE void runtime::cancel() {
  cancelled_.store(1, std::memory_order_seq_cst);  // seq_cst: parking_lot::wake's rule
  barrier_lot_.wake();
}

MIRROR_DETAIL_INLINE void runtime::fail_collective(std::exception_ptr error) noexcept {
  claim_failure(std::move(error));  // a failure claimed first (a timeout) is kept
  cancel();
}

MIRROR_DETAIL_INLINE bool runtime::claim_failure(std::exception_ptr error) noexcept {
  // State 2 (the error readable) before the caller's cancel(), so that a replica seeing the flag
  // finds the error.
  int unclaimed = 0;
  if (!failure_state_.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) return false;
  failure_ = std::move(error);
  failure_state_.store(2, std::memory_order_release);
  return true;
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

MIRROR_DETAIL_INLINE void runtime::run_job(void (*job)(const void*, int) noexcept) {
  // No replica runs here: the last call's join ordered every replica's writes before this.
  // (Written only when set: every arrival reads the line, and it should stay in their caches.)
  if (cancelled_.load(std::memory_order_relaxed)) {
    cancelled_.store(0, std::memory_order_relaxed);
    failure_state_.store(0, std::memory_order_relaxed);
    failure_ = nullptr;
  }
  trim_scratch();
  job_.run = job;
  job_.base = next_base_;
  const std::uint64_t epoch = job_.seq.load(std::memory_order_relaxed) + 1;
  job_.seq.store(epoch, std::memory_order_seq_cst);  // seq_cst: parking_lot::wake's rule
  job_lot_.wake();
  run_one(0);
  int next = 1;  // workers below it are known to have finished
  done_lot_.wait([&] { return workers_finished(epoch, next, std::memory_order_acquire); },
                 [&] { return workers_finished(epoch, next, std::memory_order_seq_cst); }, parking_lot::forever);
  // The next call numbers its arrivals above every number this one used, so no slot still
  // holding one of them (a call that ended in an error leaves half-filled barriers) can match.
  std::uint64_t most = 0;
  for (int r = 0; r < n_; ++r) most = std::max(most, replica_[static_cast<std::size_t>(r)].calls);
  next_base_ = job_.base + most;
}

// (Not inlined, or every exchange site of every payload type would get its own copy:
// docs/design.md#compile-time. The call does not show in bench/run_bench.cpp's latency.)
[[gnu::noinline]] MIRROR_DETAIL_INLINE const unsigned char* runtime::exchange_groups(int self,
                                                                                   const unsigned char* bounce,
                                                                                   std::size_t groups) {
  // Before the payload is written: after a failure a replica may still be reading this row.
  if (cancelled_.load(std::memory_order_acquire)) throw_cancelled();
  slot* const row = row_of(replica_[static_cast<std::size_t>(self)].calls + 1);
  asm volatile("" : : "r"(bounce) : "memory");  // the bounce copy is done (exchange())
  unsigned char* const mine = row[self].payload.bytes;
  for (std::size_t g = 0; g < groups; ++g) std::memcpy(mine + 16 * g, bounce + 16 * g, 16);
  arrive(self);
  return row[0].payload.bytes;
}

MIRROR_DETAIL_INLINE void runtime::run_one(int r) noexcept {
  per_replica& me = replica_[static_cast<std::size_t>(r)];
  me.calls = 0;  // only this replica writes its count, so it resets it (no line crosses cores)
  const std::uint64_t epoch = job_.seq.load(std::memory_order_relaxed);
  const runtime* outer = current;
  current = this;
  job_.run(job_.data, r);
  current = outer;
  me.finished.store(epoch, std::memory_order_seq_cst);  // seq_cst: parking_lot::wake's rule
  // A replica parked in a barrier may now know r will never arrive. (Reads one line that
  // nobody writes while nobody is parked: free when the others spin.)
  barrier_lot_.wake();
  if (r == 0) return;
  // The caller waits for every worker: the last to finish wakes it. Any worker that sees every
  // worker finished is late enough; with seq_cst on both sides, the last one always does.
  int first = 1;
  if (workers_finished(epoch, first, std::memory_order_seq_cst)) done_lot_.wake();
}

MIRROR_DETAIL_INLINE void runtime::work(int r) {
  std::uint64_t seen = 0;
  for (;;) {
    job_lot_.wait([&] { return job_.seq.load(std::memory_order_acquire) != seen; },
                  [&] { return job_.seq.load(std::memory_order_seq_cst) != seen; }, parking_lot::forever);
    seen = job_.seq.load(std::memory_order_acquire);
    if (job_.run == nullptr) return;
    run_one(r);
  }
}

MIRROR_DETAIL_INLINE void runtime::trim_scratch() noexcept {
  if (!trim_ || ++calls_since_trim_ < trim_period) return;
  calls_since_trim_ = 0;
  for (int r = 0; r < n_; ++r) {
    per_replica& me = replica_[static_cast<std::size_t>(r)];
    if (me.scratch_peak < me.scratch_bytes / 4) free_scratch(me);
    me.scratch_peak = 0;
  }
}

MIRROR_DETAIL_INLINE void runtime::arrive(int self) {
  per_replica& me = replica_[static_cast<std::size_t>(self)];
  const std::uint64_t call = ++me.calls;
  slot* const row = row_of(call);
  const std::uint64_t number = job_.base + call;
  row[self].arrived.store(number, std::memory_order_release);
  int next = 0;  // replicas below it (but self) are known to have arrived
  // (Inlined at each look: an out-of-line copy would be less code in every header-only
  // translation unit, but makes run + a 1-float all_reduce slower, and the hot path wins:
  // docs/design.md#compile-time, bench/run_bench.cpp.)
  auto all_arrived = [&](std::memory_order order) {
    for (; next < n_; ++next) {
      if (next != self && row[next].arrived.load(order) != number) return false;
    }
    return true;
  };
  // The last to arrive wakes the replicas that parked waiting for it. A first look while the
  // store above is still on its way (a seq_cst store would wait for it here, and the look for
  // the store: two hand-offs in series instead of one); then a fence, and if that look missed
  // anyone, a second. Of any two replicas the later to pass its fence sees the other's number,
  // so the last one always finds everyone, and after the fence its wake() obeys
  // parking_lot::wake's rule.
  const bool first_look = all_arrived(std::memory_order_acquire);
  seq_cst_fence();
  if (first_look || all_arrived(std::memory_order_acquire)) {
    barrier_lot_.wake();
    return;
  }
  const std::uint64_t epoch = job_.seq.load(std::memory_order_relaxed);
  auto some_finished = [&] {
    for (int r = 0; r < n_; ++r) {
      if (replica_[static_cast<std::size_t>(r)].finished.load(std::memory_order_seq_cst) == epoch) return true;
    }
    return false;
  };
  // Spinning polls the slots (and the cancel flag, a line nobody writes meanwhile); whether a
  // replica returned without reaching this barrier is checked once parked (run_one wakes).
  const bool woke = barrier_lot_.wait(
      [&] { return all_arrived(std::memory_order_acquire) || cancelled_.load(std::memory_order_acquire); },
      [&] {
        return all_arrived(std::memory_order_seq_cst) || cancelled_.load(std::memory_order_seq_cst) ||
               some_finished();
      },
      timeout_ns_);
  // Arrivals first: a replica finishes only after every barrier it reached has opened.
  if (all_arrived(std::memory_order_acquire)) return;
  if (cancelled_.load(std::memory_order_acquire)) throw_cancelled();
  throw_timeout(self, woke, number, epoch);
}

MIRROR_DETAIL_INLINE void runtime::throw_timeout(int self, bool woke, std::uint64_t number, std::uint64_t epoch) {
  if (failure_state_.load(std::memory_order_acquire) != 0) rethrow_failure();  // another replica's
  // Missing: not arrived at this collective, and (when a finished replica woke the wait) gone
  // from fn. Listed before the claim: a replica cancelled by a claimant cannot be among them,
  // since whoever claims after this list was made is not the claimant, and discards it.
  const per_replica& me = replica_[static_cast<std::size_t>(self)];
  const slot* const row = row_of(me.calls);
  const auto is_missing = [&](int r) {
    return row[r].arrived.load(std::memory_order_acquire) != number &&
           (!woke || replica_[static_cast<std::size_t>(r)].finished.load(std::memory_order_acquire) == epoch);
  };
  // Listed once (a replica may arrive meanwhile: two passes could disagree) into room for all,
  // then copied into the error's vector at its size: no growth or shrink code is compiled.
  // (Out of memory this throws std::bad_alloc, as building the vector would.)
  struct id_buffer {  // freed also if the vector below throws
    int* ids;
    ~id_buffer() { std::free(ids); }
  } buffer{static_cast<int*>(std::malloc(static_cast<std::size_t>(n_) * sizeof(int)))};
  if (buffer.ids == nullptr) throw std::bad_alloc();
  std::size_t count = 0;
  for (int r = 0; r < n_; ++r) {
    if (is_missing(r)) buffer.ids[count++] = first_id_ + r;
  }
  std::vector<int> missing(buffer.ids, buffer.ids + count);
  // "0, 1, 2": an id takes at most 11 characters, and ", " before it.
  const std::size_t room = missing.size() * 13 + 1;
  char* const list = static_cast<char*>(std::malloc(room));
  const detail::message names(list);
  if (list != nullptr) {
    std::size_t used = 0;
    list[0] = '\0';
    for (std::size_t i = 0; i < missing.size(); ++i) {
      used += static_cast<std::size_t>(std::snprintf(list + used, room - used, i == 0 ? "%d" : ", %d", missing[i]));
    }
  }
  // Thrown and caught here to keep it (std::current_exception) rather than made with
  // std::make_exception_ptr, a template that every header-only translation unit would
  // instantiate for the error type (docs/design.md#compile-time).
  const detail::message where = detail::describe_position("a collective");
  // Where every replica is: the call each one that arrived waits in, the last call of the others.
  const detail::message replicas = detail::describe_replicas(
      first_id_, self, [&](int r) { return row[r].arrived.load(std::memory_order_acquire) == number; });
  const bool described = replicas.c_str()[0] != '\0';
  try {
    // (One format call for both messages: GCC checks both strings against the arguments.)
    throw timeout_error(
        detail::with_flight_record(detail::format(
            woke ? "mirror: replica %d waits in %s%.0llu, which replicas {%s} returned from fn without "
                   "reaching%s%s%s; every replica must make the same collective calls"
                 : "mirror: replica %d waited in %s for %llu ms, and replicas {%s} did not reach it%s%s%s; "
                   "raise devices::Threads{.timeout} if they are just slow",
            first_id_ + self, where.c_str(), static_cast<unsigned long long>(woke ? 0 : timeout_ns_ / 1'000'000),
            names.c_str(), described ? " (" : "", replicas.c_str(), described ? ")" : "")),
        std::move(missing));
  } catch (const timeout_error&) {
    // The first replica to claim the failure throws its error; the others drop theirs and throw that one.
    if (claim_failure(std::current_exception())) {
      cancel();
      throw;
    }
  }
  rethrow_failure();
}

MIRROR_DETAIL_INLINE void runtime::throw_cancelled() const {
  // A cancel() under a claimed timeout (the claimant's, or that of a replica which rethrew the
  // claimant's error out of fn) ends in that error; only a replica's own failure cancels with none.
  if (failure_state_.load(std::memory_order_acquire) != 0) rethrow_failure();
  throw backend::collective_cancelled_rethrow_me{};
}

MIRROR_DETAIL_INLINE void runtime::rethrow_failure() const {
  while (failure_state_.load(std::memory_order_acquire) != 2) sched_yield();
  std::rethrow_exception(failure_);
}
#endif

}  // namespace mirror::threads
