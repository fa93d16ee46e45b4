// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::FlightRecorder`: each replica's last collectives (what, where, when, how it ended),
/// for finding a hang or a slow replica after the fact (docs/debugging.md).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mirror/source_location.hpp>
#include <stdexcept>
#include <string>
#include <vector>
#include <unistd.h>  // write(2): dump() may be called from a signal handler
#include <mirror/detail/agreement_check.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/separate_compilation.hpp>

namespace mirror {

class FlightRecorder;
namespace detail {
struct recorder_writer;

/// A call site that one thread writes and others read (relaxed): one atomic word where
/// mirror::source_location is std's (a pointer), else its file and line apart.
class atomic_site {
 public:
  void store(const mirror::source_location& where, std::memory_order order) noexcept {
#if defined(__cpp_lib_source_location)
    site_.store(where, order);
#else
    file_.store(where.file_name(), order);
    line_.store(where.line(), order);
#endif
  }
  mirror::source_location load(std::memory_order order) const noexcept {
#if defined(__cpp_lib_source_location)
    return site_.load(order);
#else
    return mirror::source_location::current(file_.load(order), line_.load(order));
#endif
  }

 private:
#if defined(__cpp_lib_source_location)
  std::atomic<mirror::source_location> site_{};
#else
  std::atomic<const char*> file_{""};
  std::atomic<std::uint_least32_t> line_{0};
#endif
};
}  // namespace detail

/// What a flight recorder kept of one collective call of one replica.
struct CollectiveRecord {
  /// How the call ended.
  enum class State : std::uint8_t {
    running,    ///< not returned yet: the replica waits in it (or is still in it)
    completed,  ///< returned its result
    failed,     ///< threw (its error, or another replica's)
  };
  std::uint64_t run = 0;       ///< the strategy's run it belongs to (1 = the first run)
  std::uint64_t sequence = 0;  ///< its number among that run's collectives of fn (1 = the first)
  std::string call;            ///< "all_reduce(sum)", "broadcast(from = 2)", "merge_call", ...
  std::uint64_t bytes = 0;     ///< what this replica passed (0 for merge_call)
  mirror::source_location where;  ///< the user's call (docs/errors.md\#call-sites)
  std::chrono::nanoseconds start{};  ///< when it started, from the recorder's creation (steady clock)
  std::chrono::nanoseconds end{};    ///< when it ended, likewise; zero while it runs
  State state = State::running;      ///< how it ended
};

/// Each local replica's last collectives: a ring of `kept()` records per replica, written by
/// the replica itself as each collective starts and ends (a few relaxed stores and two clock
/// reads per call; no allocation, no lock), readable at any time from any thread. A strategy owns
/// one (`Strategy::flight_recorder()`); its size is `Strategy::set_flight_recorder(n)`, or the
/// environment variable `MIRROR_FLIGHT_RECORDER=n` for programs you do not rebuild (default
/// `default_kept`). With `n = 0` it keeps only each replica's latest call, which timeouts
/// name whatever the setting.
///
/// A `timeout_error` or a mismatch's `shape_error` raised in fn carries the table of the
/// replicas of its process (`table()`), after its message. To find a hang that never errors,
/// call `dump(fd)` — or `mirror::dump_flight_recorders(fd)`, every live strategy's — from
/// another thread or a signal handler (docs/debugging.md).
///
/// Records read while their replica writes them may mix two calls; those of a replica that
/// waits (or hangs) are stable.
class FlightRecorder {
 public:
  /// Records kept per replica unless MIRROR_FLIGHT_RECORDER or set_flight_recorder says otherwise.
  static constexpr std::size_t default_kept = 16;

  /// For `replicas` local replicas whose global ids start at `first_id`; registered for
  /// dump_flight_recorders until destroyed.
  FlightRecorder(int replicas, int first_id, std::size_t kept);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// Local replicas recorded.
  int replicas() const noexcept { return n_; }
  /// Records kept per replica (0: only the latest call, for timeouts).
  std::size_t kept() const noexcept { return kept_; }

  /// Replica `r`'s records (its local index), oldest first: at most kept().
  std::vector<CollectiveRecord> records(int r) const;

  /// Every replica's records as text, one line each, oldest first per replica; empty when
  /// kept() is 0.
  std::string table() const;

  /// Writes table() to the file descriptor `fd` with write(2), formatting each line into a
  /// buffer on the stack: no allocation and no lock, so a signal handler may call it (the
  /// strategy must outlive the call).
  void dump(int fd) const noexcept;

  /// Replica `r`'s latest collective of the current run (sequence 0: none yet), kept whatever
  /// kept() is. Exact while `r` waits in it or has returned from fn.
  detail::collective_position last(int r) const noexcept;

 private:
  friend struct detail::recorder_writer;

  // One ring entry: written by its replica only, read by anyone.
  struct alignas(64) entry {
    std::atomic<std::uint64_t> run{0}, sequence{0}, call{0}, bytes{0};
    detail::atomic_site where;
    std::atomic<std::int64_t> start{0}, end{0};
    std::atomic<std::uint64_t> state{0};
  };
  // A replica's latest call and its ring position, on a line of its own.
  struct alignas(64) lane {
    std::atomic<std::uint64_t> sequence{0}, call{0};
    detail::atomic_site where;
    std::atomic<std::uint64_t> written{0};  // records written into the ring so far
  };

  std::int64_t now() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - epoch_).count();
  }

  // Called between runs (Strategy holds its run lock): a new ring of n records per replica.
  void keep(std::size_t n);
  // Strategy::run, on the caller's thread before the replicas start.
  void next_run() noexcept { run_.store(run_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  // Replica r starts its fn: no collective yet in this run.
  void begin_run(int r) noexcept { lanes_[static_cast<std::size_t>(r)].sequence.store(0, std::memory_order_relaxed); }
  // Replica r starts collective p of its fn, passing `bytes`.
  void start(int r, const detail::collective_position& p, std::uint64_t bytes) noexcept {
    lane& l = lanes_[static_cast<std::size_t>(r)];
    const std::uint64_t call = detail::pack_call(p.kind, p.param);
    l.call.store(call, std::memory_order_relaxed);
    l.where.store(p.where, std::memory_order_relaxed);
    l.sequence.store(p.sequence, std::memory_order_relaxed);
    if (kept_ == 0) return;
    const std::uint64_t w = l.written.load(std::memory_order_relaxed);
    entry& e = ring_[static_cast<std::size_t>(r) * kept_ + w % kept_];
    e.state.store(0, std::memory_order_relaxed);
    e.end.store(0, std::memory_order_relaxed);
    e.run.store(run_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    e.sequence.store(p.sequence, std::memory_order_relaxed);
    e.call.store(call, std::memory_order_relaxed);
    e.bytes.store(bytes, std::memory_order_relaxed);
    e.where.store(p.where, std::memory_order_relaxed);
    e.start.store(now(), std::memory_order_relaxed);
    l.written.store(w + 1, std::memory_order_release);
  }
  // Replica r's latest collective ended.
  void finish(int r, bool failed) noexcept {
    if (kept_ == 0) return;
    const std::uint64_t w = lanes_[static_cast<std::size_t>(r)].written.load(std::memory_order_relaxed);
    if (w == 0) return;
    entry& e = ring_[static_cast<std::size_t>(r) * kept_ + (w - 1) % kept_];
    e.end.store(now(), std::memory_order_relaxed);
    e.state.store(failed ? 2 : 1, std::memory_order_release);
  }

  // Formats replica r's record `k` (0 = oldest kept) into buf; false when there is none.
  bool line(int r, std::size_t k, char* buf, std::size_t size) const noexcept;

  const int n_;
  const int first_id_;
  std::size_t kept_ = 0;
  std::unique_ptr<lane[]> lanes_;
  std::unique_ptr<entry[]> ring_;  // n_ * kept_
  std::atomic<std::uint64_t> run_{0};
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
};

/// Writes the table of every live strategy's flight recorder to `fd` (write(2), no allocation,
/// no lock): for a signal handler, `signal(SIGUSR1, [](int) { mirror::dump_flight_recorders(2); })`,
/// then `kill -USR1 <pid>` on a program that hangs.
MIRROR_DETAIL_INLINE void dump_flight_recorders(int fd) noexcept;

namespace detail {

/// mirror's own access to the writing side of a recorder (ReplicaContext, Strategy).
struct recorder_writer {
  static void keep(FlightRecorder& f, std::size_t n) { f.keep(n); }
  static void next_run(FlightRecorder& f) noexcept { f.next_run(); }
  static void begin_run(FlightRecorder& f, int r) noexcept { f.begin_run(r); }
  static void start(FlightRecorder& f, int r, const collective_position& p, std::uint64_t bytes) noexcept {
    f.start(r, p, bytes);
  }
  static void finish(FlightRecorder& f, int r, bool failed) noexcept { f.finish(r, failed); }
};

/// The recorder of the strategy whose fn the calling thread runs (set by ReplicaContext; null
/// elsewhere), so that a runtime's timeout, raised on a replica's thread, can describe the others.
inline thread_local const FlightRecorder* current_recorder = nullptr;

/// Where each other local replica is, for a timeout raised on the calling replica's thread:
/// "replica 1 waits in collective #3 (all_reduce(sum)) at a.cpp:10; replica 2's last call was
/// collective #2 (broadcast(from = 0)) at a.cpp:8". `arrived(r)` says whether local replica r
/// reached the collective; ids are `first_id + r`; local replica `self` (the caller, whose
/// message names its own position) is left out. Empty when the thread runs no fn of a strategy.
template <class Arrived>
message describe_replicas(int first_id, int self, Arrived&& arrived);

/// One replica's entry of describe_replicas (out of the template: one copy per program).
MIRROR_DETAIL_INLINE void describe_replica(message& text, int id, bool reached, const collective_position& p);

/// Records to keep per replica: MIRROR_FLIGHT_RECORDER when set (a count; 0 keeps only each
/// replica's latest call), else FlightRecorder::default_kept. **Errors**: std::invalid_argument
/// naming the variable when it is not a count up to 2^20.
MIRROR_DETAIL_INLINE std::size_t kept_from_environment();

/// `text`, followed by the calling thread's flight recorder table when it keeps records: what a
/// timeout or mismatch raised in fn carries.
MIRROR_DETAIL_INLINE message with_flight_record(message text);

template <class Arrived>
message describe_replicas(int first_id, int self, Arrived&& arrived) {
  message text;
  const FlightRecorder* const log = current_recorder;
  if (log == nullptr) return text;
  for (int r = 0; r < log->replicas(); ++r) {
    if (r != self) describe_replica(text, first_id + r, arrived(r), log->last(r));
  }
  return text;
}

/// The live recorders that dump_flight_recorders writes (a fixed table: registering allocates
/// nothing, and a signal handler can walk it). A recorder beyond its size is not listed.
inline std::atomic<const FlightRecorder*> flight_recorders[64] = {};

}  // namespace detail

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE FlightRecorder::FlightRecorder(int replicas, int first_id, std::size_t kept)
    : n_(replicas), first_id_(first_id), lanes_(new lane[static_cast<std::size_t>(replicas)]) {
  keep(kept);
  for (auto& slot : detail::flight_recorders) {
    const FlightRecorder* empty = nullptr;
    if (slot.compare_exchange_strong(empty, this)) break;
  }
}

MIRROR_DETAIL_INLINE FlightRecorder::~FlightRecorder() {
  for (auto& slot : detail::flight_recorders) {
    const FlightRecorder* me = this;
    if (slot.compare_exchange_strong(me, nullptr)) break;
  }
}

MIRROR_DETAIL_INLINE void FlightRecorder::keep(std::size_t n) {
  std::unique_ptr<entry[]> ring(n == 0 ? nullptr : new entry[static_cast<std::size_t>(n_) * n]);
  ring_ = std::move(ring);
  kept_ = n;
  for (int r = 0; r < n_; ++r) lanes_[static_cast<std::size_t>(r)].written.store(0, std::memory_order_relaxed);
}

MIRROR_DETAIL_INLINE detail::collective_position FlightRecorder::last(int r) const noexcept {
  const lane& l = lanes_[static_cast<std::size_t>(r)];
  const std::uint64_t call = l.call.load(std::memory_order_relaxed);
  return {l.sequence.load(std::memory_order_relaxed), detail::kind_of_call(call), detail::param_of_call(call),
          l.where.load(std::memory_order_relaxed)};
}

MIRROR_DETAIL_INLINE std::vector<CollectiveRecord> FlightRecorder::records(int r) const {
  std::vector<CollectiveRecord> out;
  if (kept_ == 0) return out;
  const std::uint64_t w = lanes_[static_cast<std::size_t>(r)].written.load(std::memory_order_acquire);
  const std::uint64_t first = w > kept_ ? w - kept_ : 0;
  for (std::uint64_t i = first; i < w; ++i) {
    const entry& e = ring_[static_cast<std::size_t>(r) * kept_ + i % kept_];
    const std::uint64_t call = e.call.load(std::memory_order_relaxed);
    CollectiveRecord c;
    c.state = static_cast<CollectiveRecord::State>(e.state.load(std::memory_order_acquire));
    c.run = e.run.load(std::memory_order_relaxed);
    c.sequence = e.sequence.load(std::memory_order_relaxed);
    c.call = detail::name_of_call(call).text;
    c.bytes = e.bytes.load(std::memory_order_relaxed);
    c.where = e.where.load(std::memory_order_relaxed);
    c.start = std::chrono::nanoseconds(e.start.load(std::memory_order_relaxed));
    c.end = std::chrono::nanoseconds(e.end.load(std::memory_order_relaxed));
    out.push_back(std::move(c));
  }
  return out;
}

MIRROR_DETAIL_INLINE bool FlightRecorder::line(int r, std::size_t k, char* buf, std::size_t size) const noexcept {
  const std::uint64_t w = lanes_[static_cast<std::size_t>(r)].written.load(std::memory_order_acquire);
  const std::uint64_t first = w > kept_ ? w - kept_ : 0;
  if (kept_ == 0 || first + k >= w) return false;
  const entry& e = ring_[static_cast<std::size_t>(r) * kept_ + (first + k) % kept_];
  const std::uint64_t state = e.state.load(std::memory_order_acquire);
  const std::uint64_t call = e.call.load(std::memory_order_relaxed);
  const mirror::source_location where = e.where.load(std::memory_order_relaxed);
  const double start = static_cast<double>(e.start.load(std::memory_order_relaxed)) * 1e-9;
  const double took = static_cast<double>(e.end.load(std::memory_order_relaxed) -
                                          e.start.load(std::memory_order_relaxed)) * 1e-3;
  const detail::call_name name = detail::name_of_call(call);
  const int used = std::snprintf(
      buf, size, "  replica %d  run %llu  #%llu  %-22s %10llu B  at %s:%u  started at %.6f s, %s", first_id_ + r,
      static_cast<unsigned long long>(e.run.load(std::memory_order_relaxed)),
      static_cast<unsigned long long>(e.sequence.load(std::memory_order_relaxed)), name.text,
      static_cast<unsigned long long>(e.bytes.load(std::memory_order_relaxed)),
      where.line() == 0 ? "an unknown call site" : where.file_name(), static_cast<unsigned>(where.line()), start,
      state == 0 ? "running" : state == 1 ? "completed in" : "failed after");
  if (used > 0 && state != 0 && static_cast<std::size_t>(used) < size) {
    std::snprintf(buf + used, size - static_cast<std::size_t>(used), " %.1f us", took);
  }
  return true;
}

MIRROR_DETAIL_INLINE std::string FlightRecorder::table() const {
  std::string out;
  if (kept_ == 0) return out;
  char buf[768];
  std::snprintf(buf, sizeof buf, "flight recorder: the last %zu collectives of replicas %d..%d, oldest first:\n", kept_,
                first_id_, first_id_ + n_ - 1);
  out += buf;
  for (int r = 0; r < n_; ++r) {
    for (std::size_t k = 0; line(r, k, buf, sizeof buf); ++k) {
      out += buf;
      out += '\n';
    }
  }
  return out;
}

MIRROR_DETAIL_INLINE void FlightRecorder::dump(int fd) const noexcept {
  if (kept_ == 0) return;
  char buf[768];
  const auto put = [&](int n) {
    if (n <= 0) return;
    const std::size_t len = static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1;
    for (std::size_t done = 0; done < len;) {
      const ssize_t wrote = ::write(fd, buf + done, len - done);
      if (wrote <= 0) return;
      done += static_cast<std::size_t>(wrote);
    }
  };
  put(std::snprintf(buf, sizeof buf, "flight recorder: the last %zu collectives of replicas %d..%d, oldest first:\n",
                    kept_, first_id_, first_id_ + n_ - 1));
  for (int r = 0; r < n_; ++r) {
    for (std::size_t k = 0; line(r, k, buf, sizeof buf - 1); ++k) {
      std::size_t n = 0;
      while (n < sizeof buf - 2 && buf[n] != '\0') ++n;
      buf[n] = '\n';
      put(static_cast<int>(n + 1));
    }
  }
}

MIRROR_DETAIL_INLINE void dump_flight_recorders(int fd) noexcept {
  for (const auto& slot : detail::flight_recorders) {
    if (const FlightRecorder* r = slot.load(std::memory_order_acquire)) r->dump(fd);
  }
}

namespace detail {
MIRROR_DETAIL_INLINE void describe_replica(message& text, int id, bool reached, const collective_position& p) {
  const char* const sep = text.c_str()[0] == '\0' ? "" : "; ";
  if (reached) {
    text = format("%s%sreplica %d waits in %s", text.c_str(), sep, id, describe_position(p, "a collective").c_str());
  } else if (p.sequence == 0) {
    text = format("%s%sreplica %d made no collective call in this run", text.c_str(), sep, id);
  } else {
    text = format("%s%sreplica %d's last call was %s", text.c_str(), sep, id, describe_position(p, "").c_str());
  }
}

MIRROR_DETAIL_INLINE std::size_t kept_from_environment() {
  const char* const text = std::getenv("MIRROR_FLIGHT_RECORDER");
  if (text == nullptr) return FlightRecorder::default_kept;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-' || n > (1ull << 20)) {
    throw std::invalid_argument(std::string("mirror: MIRROR_FLIGHT_RECORDER=") + text +
                                ": expected how many collectives the flight recorder keeps per replica, 0 to 1048576 "
                                "(0 keeps only each replica's latest call)");
  }
  return static_cast<std::size_t>(n);
}

MIRROR_DETAIL_INLINE message with_flight_record(message text) {
  const FlightRecorder* const log = current_recorder;
  if (log == nullptr || log->kept() == 0) return text;
  std::string table = log->table();
  if (!table.empty() && table.back() == '\n') table.pop_back();
  return format("%s\n%s", text.c_str(), table.c_str());
}
}  // namespace detail
#endif

}  // namespace mirror
