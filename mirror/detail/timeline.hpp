// SPDX-License-Identifier: Apache-2.0
#pragma once
// The timeline (docs/debugging.md#the-timeline): spans recorded by each replica's thread (its fn,
// its collectives and their phases) and by whichever thread makes a worker's MPI calls (its
// communication thread, or a caller running its own job), each into a track of its own without a
// lock, written between runs as a Chrome trace (JSON) that
// Perfetto and chrome://tracing draw. Off, it costs a thread-local load and a branch where a
// span would start.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mirror/source_location.hpp>
#include <string>
#include <string_view>
#include <vector>
#include <mirror/detail/agreement_check.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/error.hpp>

namespace mirror::detail {

/// Steady-clock nanoseconds: the timeline's time, the same in every process of a host.
inline std::int64_t trace_now() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// What a span is. `name` says it for the phases; a collective's name is its call.
enum class trace_kind : std::uint8_t {
  fn,          // a replica's fn, from its start to its return
  collective,  // one collective of fn: sequence, call (pack_call), bytes, where
  phase,       // a part of a collective (agreement check, waiting for peers, cross-worker step)
  job,         // a worker's MPI work for one cross-worker call
};

struct trace_event {
  std::int64_t begin = 0, end = 0;
  const char* name = "";  // static storage
  trace_kind kind = trace_kind::phase;
  bool failed = false;
  std::uint64_t sequence = 0, call = 0, bytes = 0;
  mirror::source_location where{};
};

/// The spans one thread records (a replica's; a worker's MPI calls, made by one thread at a
/// time). Only that thread writes it; the timeline reads it between runs, when it records
/// nothing.
class trace_track {
 public:
  trace_track(int pid, int tid, std::string label) : pid_(pid), tid_(tid), label_(std::move(label)) {
    events_.reserve(reserved);
  }

  /// A span from `begin` to now.
  void span(const char* name, trace_kind kind, std::int64_t begin) noexcept {
    trace_event e;
    e.begin = begin;
    e.end = trace_now();
    e.name = name;
    e.kind = kind;
    push(e);
  }
  /// Keeps `e` (beyond the reserve it allocates; out of memory, the span is left out).
  void push(const trace_event& e) noexcept {
    try {
      events_.push_back(e);
    } catch (...) {
    }
  }

  // A replica's fn in progress, and its collective in progress (pushed when it ends).
  std::int64_t fn_begin = 0;
  trace_event open{};

  /// Spans kept before the timeline writes them out at the end of a run.
  static constexpr std::size_t reserved = 8192;

 private:
  friend class timeline;
  int pid_, tid_;
  std::string label_;
  std::vector<trace_event> events_;
};

/// The track of the calling thread while it runs a replica's fn with the timeline on (set by
/// ReplicaContext), else null: where a collective's phases go.
inline thread_local trace_track* current_track = nullptr;

/// Records a phase on the calling thread's track from its construction to its destruction
/// (also when left by an exception); nothing without a track.
class trace_phase {
 public:
  explicit trace_phase(const char* name) noexcept
      : track_(current_track), name_(name), begin_(track_ != nullptr ? trace_now() : 0) {}
  trace_phase(const trace_phase&) = delete;
  trace_phase& operator=(const trace_phase&) = delete;
  ~trace_phase() {
    if (track_ != nullptr) track_->span(name_, trace_kind::phase, begin_);
  }

 private:
  trace_track* track_;
  const char* name_;
  std::int64_t begin_;
};

/// One strategy's timeline: a track per local replica and one for the worker's MPI calls, and
/// the file they are written to (worker w of several writes its own: FILE with
/// ".worker<w>" before a ".json" suffix).
class timeline {
 public:
  timeline(int replicas, int worker, int workers) : replicas_(replicas), worker_(worker), workers_(workers) {}
  ~timeline() { close(); }
  timeline(const timeline&) = delete;
  timeline& operator=(const timeline&) = delete;

  /// Starts writing to `path` (this worker's file name: file_of). **Errors**: backend_error when
  /// the file cannot be opened.
  void open(const std::string& path);
  /// Writes what is recorded and ends the file (valid JSON from then on); nothing when closed.
  void close() noexcept;
  /// close() for a process that ends abnormally (open_timelines): the tracks stay, since threads
  /// that still run may hold them; nothing from a forked child of the process that opened it.
  void end_abruptly() noexcept;
  /// Whether a file is open.
  bool on() const noexcept { return file_ != nullptr; }
  /// This worker's file for `path`.
  std::string file_of(const std::string& path) const;

  trace_track* replica_track(int r) noexcept { return on() ? tracks_[static_cast<std::size_t>(r)].get() : nullptr; }
  trace_track* comm_track() noexcept { return on() && workers_ > 1 ? tracks_.back().get() : nullptr; }

  /// Between runs: writes the tracks out when one of them has filled its reserve.
  void drain_if_full() noexcept {
    if (!on()) return;
    for (const auto& t : tracks_) {
      if (t->events_.size() >= trace_track::reserved / 2) {
        drain();
        return;
      }
    }
  }

 private:
  void drain() noexcept;
  void write_track(trace_track& t) noexcept;
  void write_event(const trace_track& t, const char* name, const char* category, std::int64_t begin, std::int64_t end,
                   const trace_event* collective) noexcept;

  int replicas_, worker_, workers_;
  std::vector<std::unique_ptr<trace_track>> tracks_;
  std::FILE* file_ = nullptr;
  std::string path_;
  bool first_ = true;
  long opener_ = 0;  // the process that opened file_ (getpid)
};

/// The timelines with an open file. A trace is most wanted when the program ends abnormally, and
/// then no strategy's destructor runs: so std::exit, an uncaught exception (std::terminate) and
/// the fatal signals write out what each open timeline recorded and end its file, so that it is
/// valid JSON. The handlers are installed when the first timeline opens (the signals' previous
/// actions are taken again, and the signal raised again, once the files are closed). Best effort
/// on a signal: writing formats and allocates, which a crash inside the allocator may not survive.
class open_timelines {
 public:
  static void add(timeline* t) noexcept;
  static void remove(timeline* t) noexcept;
  /// Ends every open timeline's file (timeline::end_abruptly). From a signal handler
  /// (`in_signal`), skipped where the list is held (the signal may have come while it was).
  static void close_all(bool in_signal = false) noexcept;
};

#if MIRROR_DETAIL_HEADER_DEFINITIONS
}  // namespace mirror::detail
#include <csignal>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <signal.h>  // sigaction
#include <unistd.h>  // alarm, getpid
namespace mirror::detail {

// open_timelines' state and handlers (only where the definitions are compiled).
namespace timeline_exit {
inline constexpr int fatal[6] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM};
struct state {
  std::mutex mutex;
  std::vector<timeline*> open;
  std::terminate_handler previous_terminate = nullptr;
  struct sigaction previous[6] = {};
};
MIRROR_DETAIL_INLINE state& get() noexcept {
  static state* s = new state();  // never destroyed: an exit handler may still use it
  return *s;
}
// Whether this thread holds the list: a signal handler that interrupted it must not lock again.
inline thread_local bool holding = false;
struct hold {
  std::lock_guard<std::mutex> lock{get().mutex};
  hold() noexcept { holding = true; }
  ~hold() { holding = false; }
};
MIRROR_DETAIL_INLINE void on_terminate() {
  open_timelines::close_all();
  const std::terminate_handler previous = get().previous_terminate;
  if (previous != nullptr) previous();
  std::abort();
}
MIRROR_DETAIL_INLINE void on_signal(int sig) noexcept {
  // Writing formats and allocates: a crash inside the allocator could hang here. SIGALRM's
  // default action ends the process if the files take more than 2 s.
  ::alarm(2);
  open_timelines::close_all(true);
  state& s = get();
  for (int i = 0; i < 6; ++i) {
    if (fatal[i] == sig) sigaction(sig, &s.previous[i], nullptr);
  }
  std::raise(sig);  // the previous action (by default: end the process, with a core where due)
}
MIRROR_DETAIL_INLINE void install() noexcept {
  state& s = get();
  std::atexit([] { open_timelines::close_all(); });
  s.previous_terminate = std::set_terminate(on_terminate);
  struct sigaction action = {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 6; ++i) {
    sigaction(fatal[i], &action, &s.previous[i]);
    // SIGTERM may be the program's own (a checkpoint on preemption) or ignored: leave it so.
    if (fatal[i] == SIGTERM && s.previous[i].sa_handler != SIG_DFL) sigaction(SIGTERM, &s.previous[i], nullptr);
  }
}
}  // namespace timeline_exit

MIRROR_DETAIL_INLINE void open_timelines::add(timeline* t) noexcept {
  static std::once_flag installed;
  std::call_once(installed, timeline_exit::install);
  timeline_exit::state& s = timeline_exit::get();
  const timeline_exit::hold held;
  try {
    s.open.push_back(t);
  } catch (...) {
    // Out of memory: this timeline is closed by its strategy only.
  }
}

MIRROR_DETAIL_INLINE void open_timelines::remove(timeline* t) noexcept {
  timeline_exit::state& s = timeline_exit::get();
  const timeline_exit::hold held;
  s.open.erase(std::remove(s.open.begin(), s.open.end(), t), s.open.end());
}

MIRROR_DETAIL_INLINE void open_timelines::close_all(bool in_signal) noexcept {
  timeline_exit::state& s = timeline_exit::get();
  std::unique_lock lock(s.mutex, std::defer_lock);
  if (in_signal) {
    if (timeline_exit::holding || !lock.try_lock()) return;
  } else {
    lock.lock();
  }
  std::vector<timeline*> open;
  open.swap(s.open);
  lock.unlock();
  for (timeline* t : open) t->end_abruptly();
}

MIRROR_DETAIL_INLINE std::string timeline::file_of(const std::string& path) const {
  if (workers_ <= 1) return path;
  const std::string tag = ".worker" + std::to_string(worker_);
  const std::string suffix = ".json";
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return path.substr(0, path.size() - suffix.size()) + tag + suffix;
  }
  return path + tag;
}

MIRROR_DETAIL_INLINE void timeline::open(const std::string& path) {
  close();
  const std::string file = file_of(path);
  std::FILE* f = std::fopen(file.c_str(), "w");
  if (f == nullptr) {
    throw backend_error(format("mirror: the timeline file %s cannot be written (set_timeline or MIRROR_TIMELINE); "
                               "give a path in a writable folder",
                               file.c_str()),
                        -1);
  }
  tracks_.clear();
  for (int r = 0; r < replicas_; ++r) {
    tracks_.push_back(std::make_unique<trace_track>(worker_, r, "replica " + std::to_string(worker_ * replicas_ + r)));
  }
  if (workers_ > 1) tracks_.push_back(std::make_unique<trace_track>(worker_, replicas_, "cross-worker MPI calls"));
  file_ = f;
  path_ = file;
  first_ = true;
  opener_ = ::getpid();
  open_timelines::add(this);
  std::fprintf(file_, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
  std::fprintf(file_, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"worker %d\"}}",
               worker_, worker_);
  for (const auto& t : tracks_) {
    std::fprintf(file_,
                 ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}"
                 ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                 t->pid_, t->tid_, t->label_.c_str(), t->pid_, t->tid_, t->tid_);
  }
  first_ = false;
}

MIRROR_DETAIL_INLINE void timeline::end_abruptly() noexcept {
  std::FILE* const f = file_;
  if (f == nullptr) return;
  if (::getpid() == opener_) {  // (a forked child leaves its parent's file alone)
    for (const auto& t : tracks_) write_track(*t);
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  file_ = nullptr;  // later runs record nothing; the tracks stay for threads that hold them
}

MIRROR_DETAIL_INLINE void timeline::close() noexcept {
  if (file_ == nullptr) return;
  open_timelines::remove(this);
  drain();
  std::fprintf(file_, "\n]}\n");
  std::fclose(file_);
  file_ = nullptr;
  tracks_.clear();
}

MIRROR_DETAIL_INLINE void timeline::drain() noexcept {
  for (const auto& t : tracks_) write_track(*t);
  std::fflush(file_);
}

// JSON string contents: quotes, backslashes and control characters escaped.
MIRROR_DETAIL_INLINE void write_json_text(std::FILE* f, const char* s) noexcept {
  const char* c = s;
  while (*c != '\0' && *c != '"' && *c != '\\' && static_cast<unsigned char>(*c) >= 0x20) ++c;
  if (*c == '\0') {  // the usual case: nothing to escape
    std::fputs(s, f);
    return;
  }
  for (; *s != '\0'; ++s) {
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      std::fputc('\\', f);
      std::fputc(c, f);
    } else if (c < 0x20) {
      std::fprintf(f, "\\u%04x", c);
    } else {
      std::fputc(c, f);
    }
  }
}

// Appends `ns` as microseconds with three decimals ("12.345"): integer digits, because printf's
// floating-point conversion made writing a span cost about as much as recording twenty.
MIRROR_DETAIL_INLINE char* put_microseconds(char* out, std::int64_t ns) noexcept {
  if (ns < 0) {
    *out++ = '-';
    ns = -ns;
  }
  char digits[24];
  int n = 0;
  auto u = static_cast<std::uint64_t>(ns);
  do {
    digits[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0 || n < 4);
  while (n > 3) *out++ = digits[--n];
  *out++ = '.';
  while (n > 0) *out++ = digits[--n];
  return out;
}

MIRROR_DETAIL_INLINE void timeline::write_event(const trace_track& t, const char* name, const char* category,
                                                 std::int64_t begin, std::int64_t end,
                                                 const trace_event* c) noexcept {
  std::fputs(first_ ? "{\"name\":\"" : ",\n{\"name\":\"", file_);
  first_ = false;
  write_json_text(file_, name);
  char line[160];
  char* at = line;
  const auto put = [&](const char* text) {
    while (*text != '\0') *at++ = *text++;
  };
  put("\",\"cat\":\"");
  put(category);
  put("\",\"ph\":\"X\",\"ts\":");
  at = put_microseconds(at, begin);
  put(",\"dur\":");
  at = put_microseconds(at, end - begin);
  at += std::snprintf(at, static_cast<std::size_t>(line + sizeof line - at), ",\"pid\":%d,\"tid\":%d", t.pid_, t.tid_);
  std::fwrite(line, 1, static_cast<std::size_t>(at - line), file_);
  if (c != nullptr) {
    std::fprintf(file_, ",\"args\":{\"sequence\":%llu,\"bytes\":%llu,\"state\":\"%s\",\"site\":\"",
                 static_cast<unsigned long long>(c->sequence), static_cast<unsigned long long>(c->bytes),
                 c->failed ? "failed" : "completed");
    write_json_text(file_, c->where.line() == 0 ? "unknown" : c->where.file_name());
    std::fprintf(file_, ":%u\"}", static_cast<unsigned>(c->where.line()));
  }
  std::fputc('}', file_);
}

MIRROR_DETAIL_INLINE void timeline::write_track(trace_track& t) noexcept {
  std::vector<trace_event>& ev = t.events_;
  // Parents before their children: by start, the longer first.
  const auto before = [](const trace_event& a, const trace_event& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  };
  std::stable_sort(ev.begin(), ev.end(), before);
  // The gaps inside a span that no child covers are named for what the replica does then: its
  // own computation inside fn, its own copying and combining inside a collective. They join the
  // recorded spans, and everything is written in time order. Gaps under a microsecond are left
  // out: they are bookkeeping between two phases, and writing them would double the spans of a
  // small collective.
  std::vector<trace_event> gaps;
  const auto fill = [&](const trace_event& parent, std::size_t from, const char* name) {
    std::int64_t at = parent.begin;
    const auto gap = [&](std::int64_t b, std::int64_t e) {
      if (e - b < 1000) return;
      trace_event g;
      g.begin = b;
      g.end = e;
      g.name = name;
      g.kind = trace_kind::phase;
      gaps.push_back(g);
    };
    for (std::size_t k = from; k < ev.size() && ev[k].begin < parent.end; ++k) {
      const trace_event& child = ev[k];
      if (child.begin < at) continue;  // nested deeper, or overlapping what was covered
      if (child.begin > at) gap(at, child.begin);
      at = std::max(at, child.end);
    }
    if (parent.end > at) gap(at, parent.end);
  };
  try {
    for (std::size_t k = 0; k < ev.size(); ++k) {
      if (ev[k].kind == trace_kind::fn) fill(ev[k], k + 1, "compute");
      if (ev[k].kind == trace_kind::collective) fill(ev[k], k + 1, "copy / combine");
    }
    ev.insert(ev.end(), gaps.begin(), gaps.end());
  } catch (...) {
    // Out of memory: the recorded spans alone.
  }
  std::stable_sort(ev.begin(), ev.end(), before);
  for (const trace_event& e : ev) {
    switch (e.kind) {
      case trace_kind::fn: write_event(t, "fn", "fn", e.begin, e.end, nullptr); break;
      case trace_kind::collective: {
        const call_name name = name_of_call(e.call);
        write_event(t, name.text, "collective", e.begin, e.end, &e);
        break;
      }
      case trace_kind::phase:
        write_event(t, e.name, std::string_view(e.name) == "compute" ? "fn" : "phase", e.begin, e.end, nullptr);
        break;
      case trace_kind::job: write_event(t, e.name, "mpi", e.begin, e.end, nullptr); break;
    }
  }
  ev.clear();
}
#endif

}  // namespace mirror::detail
