// SPDX-License-Identifier: Apache-2.0
// The multi-worker mode of the fault-injection suite (tests/fault/fault_injection.cpp covers one
// process): under mpirun, every worker draws the same trials of `run` (random local replica
// counts, ops policies and programs of collectives, blocking, non-blocking and gradient buckets),
// most with one injected fault, and checks
// its outcome against what docs/errors.md and docs/multi-worker.md promise; then the workers
// compare their outcomes, which must be the same everywhere:
//   - no fault: every collective's result on every replica of every worker is the serial loop's
//     over the global replicas (small integers, exact in any order; NaNs and signed zeros for
//     min and max);
//   - a global replica throws before collective k: replica_error naming it on every worker (when
//     two throw, one of them), the original nested on the thrower's own worker;
//   - a replica returns before collective k with another replica on its worker: timeout_error on
//     every worker, missing() == {it}, in global ids; a worker whose only replica returns early:
//     its run returns, the others' run and that worker's next run throw that timeout_error, and
//     the others' next run is refused with it (runs pair by their count);
//   - a replica passes another size, op, root or collective at k: shape_error on every worker
//     naming collective #k, and no span leaf changes anywhere;
//   - a whole worker makes an extra call outside run (reduce, gather, broadcast, a sync-on-read
//     read) before the run: shape_error on every worker, naming both calls, and that worker's
//     run is refused with it;
//   - every worker makes the same runs, and after every trial three more, each all-reducing
//     values of its own (run, replica): every one that returns is exact on every replica of
//     every worker (a run paired with another run's collective would be off), and every one
//     after those the fault spoiled returns.
// A replica arriving only after the others timed out is not injected here: after a cross-worker
// timeout the strategy cannot continue (docs/multi-worker.md), so it is tested on its own
// (tests/mpi/failure_test.cpp, tests/mpi/agreement_test.cpp).
//
//   mpirun -np W cluster_fault_injection [--trials N] [--seed S] [--first T] [--hang-seconds H] [--verbose]
//
// Trial t uses the random stream (S, t) on every worker, so `--first T --trials 1` replays one.
// The test suite runs a few hundred trials on 2 and 3 workers (suite 'fault'); a release runs
// 10,000 on each (docs/multi-worker.md).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>
#include "fault/fault_reference.hpp"  // reference, same
#include "fault/trial_options.hpp"  // parse_trial_options

namespace {

using mirror::ReduceOp;
using mirror::test::reference;
using mirror::test::same;
using namespace std::chrono_literals;
using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;

int W = 1, me = 0;  // workers, this worker

// ---------------- the program of one trial ----------------

enum class kind { reduce_vector, reduce_span, reduce_scalar, reduce_tuple, broadcast_vector, broadcast_span, merge,
                  gather, scatter, reduce_async, buckets };
constexpr int kinds = 11;
const char* name(kind k) {
  switch (k) {
    case kind::reduce_vector: return "all_reduce(vector)";
    case kind::reduce_span: return "all_reduce(span)";
    case kind::reduce_scalar: return "all_reduce(double)";
    case kind::reduce_tuple: return "all_reduce(tuple)";
    case kind::broadcast_vector: return "broadcast(vector)";
    case kind::broadcast_span: return "broadcast(span)";
    case kind::merge: return "merge_call";
    case kind::gather: return "all_gather";
    case kind::scatter: return "reduce_scatter";
    case kind::reduce_async: return "all_reduce_async(span)";
    case kind::buckets: return "gradient_buckets";
  }
  return "?";
}
bool is_reduce(kind k) { return k <= kind::reduce_tuple; }

struct step {
  kind k;
  ReduceOp op = ReduceOp::sum;
  std::size_t n = 1;  // elements of the vector/span leaf
  int from = 0;       // broadcast's source (global)
};

enum class fault { none, throw_before, two_throw, return_before, wrong_size, wrong_op, wrong_root, wrong_kind,
                   outside_run };
const char* name(fault f) {
  switch (f) {
    case fault::none: return "none";
    case fault::throw_before: return "throw";
    case fault::two_throw: return "two throw";
    case fault::return_before: return "return early";
    case fault::wrong_size: return "wrong size";
    case fault::wrong_op: return "wrong op";
    case fault::wrong_root: return "wrong root";
    case fault::wrong_kind: return "wrong collective";
    case fault::outside_run: return "call outside run";
  }
  return "?";
}

struct trial {
  std::uint64_t id = 0;
  int policy = 0;    // 0 Hierarchical<ChunkOwnerAllReduce>, 1 Hierarchical<ReductionToOneDevice>, MpiAllReduce{.deterministic}
  int replicas = 1;  // R, local replicas per worker
  std::vector<step> program;
  fault f = fault::none;
  int who = 0, second = 0;  // the faulty global replica(s); outside_run: who's worker
  int at = 0;               // before which step (0-based)
  int outside = 0;          // outside_run: which call
};
int global_replicas(const trial& t) { return W * t.replicas; }

// Global replica g's input element i of step s of trial t.
double input(const trial& t, int s, int g, std::size_t i) {
  const step& st = t.program[static_cast<std::size_t>(s)];
  const std::uint64_t h = (t.id * 1000003u + static_cast<std::uint64_t>(s) * 7919u + static_cast<std::uint64_t>(g) * 131u +
                           i * 17u) % 1009u;
  if (st.op == ReduceOp::prod) return h % 3 == 0 ? 2.0 : (h % 3 == 1 ? 1.0 : -1.0);
  if ((st.op == ReduceOp::min || st.op == ReduceOp::max) && st.k != kind::reduce_tuple) {
    if (h % 97 == 0) return std::numeric_limits<double>::quiet_NaN();
    if (h % 13 == 0) return -0.0;
    if (h % 11 == 0) return 0.0;
  }
  return static_cast<double>(static_cast<int>(h % 41) - 20);
}

trial make_trial(std::uint64_t seed, std::uint64_t id) {
  std::mt19937_64 g(seed * 0x9e3779b97f4a7c15ull + id);
  auto pick = [&](int n) { return static_cast<int>(g() % static_cast<std::uint64_t>(n)); };
  trial t;
  t.id = id;
  t.policy = pick(2);
  t.replicas = 1 + pick(3);
  const int N = global_replicas(t);
  const int steps = 1 + pick(4);
  for (int s = 0; s < steps; ++s) {
    step st;
    st.k = static_cast<kind>(pick(kinds));
    st.op = static_cast<ReduceOp>(pick(5));
    st.n = pick(4) == 0 ? static_cast<std::size_t>(1 + pick(5000)) : static_cast<std::size_t>(pick(20));
    if (st.k != kind::reduce_vector && st.k != kind::gather && st.k != kind::scatter) st.n = std::max<std::size_t>(st.n, 1);
    st.from = pick(N);
    t.program.push_back(st);
  }
  // A fault in 3 trials of 4.
  const int choice = pick(16);
  t.at = pick(steps);
  t.who = pick(N);
  t.second = pick(N);
  t.outside = pick(4);
  const step& st = t.program[static_cast<std::size_t>(t.at)];
  const bool reduce_like =
      is_reduce(st.k) || st.k == kind::scatter || st.k == kind::reduce_async || st.k == kind::buckets;
  if (choice < 4) {
    t.f = fault::none;
  } else if (choice < 7) {
    t.f = fault::throw_before;
  } else if (choice == 7) {
    t.f = t.second != t.who ? fault::two_throw : fault::throw_before;
  } else if (choice < 10) {
    t.f = fault::return_before;
  } else if (choice == 10) {
    t.f = (reduce_like && st.k != kind::reduce_scalar) || st.k == kind::broadcast_span ? fault::wrong_size
                                                                                       : fault::wrong_kind;
  } else if (choice == 11) {
    t.f = reduce_like ? fault::wrong_op : fault::wrong_kind;
  } else if (choice == 12) {
    t.f = (st.k == kind::broadcast_vector || st.k == kind::broadcast_span) && N > 1 ? fault::wrong_root
                                                                                     : fault::wrong_kind;
  } else if (choice < 15) {
    t.f = fault::wrong_kind;
  } else {
    t.f = fault::outside_run;
  }
  return t;
}

std::string describe(const trial& t) {
  static const char* policies[] = {"Hierarchical<ChunkOwnerAllReduce>", "Hierarchical<ReductionToOneDevice, deterministic>"};
  std::string s = "trial " + std::to_string(t.id) + ": " + std::to_string(W) + " workers x " +
                  std::to_string(t.replicas) + ", " + policies[t.policy] + ", ";
  static const char* outside[] = {"Strategy::reduce", "Strategy::gather", "Strategy::broadcast", "SyncOnReadVariable::value"};
  if (t.f == fault::none) {
    s += "no fault";
  } else if (t.f == fault::outside_run) {
    s += std::string("worker ") + std::to_string(t.who / t.replicas) + " calls " + outside[t.outside] + " outside run";
  } else {
    s += std::string("fault ") + name(t.f) + " by replica " + std::to_string(t.who);
    if (t.f == fault::two_throw) s += " and " + std::to_string(t.second);
    s += " before collective #" + std::to_string(t.at + 1);
  }
  s += "; program:";
  for (const step& st : t.program) {
    s += std::string(" ") + name(st.k) + "[" + std::string(mirror::to_string(st.op)) + ", n=" + std::to_string(st.n) +
         ", from=" + std::to_string(st.from) + "]";
  }
  return s;
}

// ---------------- the watchdog ----------------

std::atomic<std::int64_t> trial_started_ns{0};
std::atomic<bool> watching{true};
std::mutex current_mutex;
std::string current_trial;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void watchdog(double hang_seconds) {
  while (watching.load()) {
    std::this_thread::sleep_for(100ms);
    const std::int64_t started = trial_started_ns.load();
    if (started == 0 || now_ns() - started < static_cast<std::int64_t>(hang_seconds * 1e9)) continue;
    std::lock_guard lock(current_mutex);
    std::fprintf(stderr, "cluster_fault_injection: HANG on worker %d: %s\nran for more than %.0f s\n", me,
                 current_trial.c_str(), hang_seconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
}

// ---------------- one trial ----------------

// What a worker's run (or its call outside run) reported, as compared across workers.
enum class seen : std::int64_t { nothing = 0, replica = 1, shape = 2, timeout = 3, other = 4 };

struct outcome {
  seen kind = seen::nothing;
  int replica = -1;          // replica_error's
  std::vector<int> missing;  // timeout_error's
  std::string text;
  std::string nested;  // replica_error's nested original, if any
};

template <class F>
outcome catching(F&& body) {
  outcome o;
  try {
    body();
  } catch (const mirror::replica_error& e) {
    o.kind = seen::replica;
    o.replica = e.replica();
    o.text = e.what();
    if (e.nested_ptr()) {  // (rethrow_nested of none would terminate)
      try {
        std::rethrow_exception(e.nested_ptr());
      } catch (const std::exception& original) {
        o.nested = original.what();
      } catch (...) {
      }
    }
  } catch (const mirror::timeout_error& e) {
    o.kind = seen::timeout;
    o.missing = e.missing();
    o.text = e.what();
  } catch (const mirror::shape_error& e) {
    o.kind = seen::shape;
    o.text = e.what();
  } catch (const std::exception& e) {
    o.kind = seen::other;
    o.text = std::string("unexpected exception: ") + e.what();
  }
  return o;
}

template <class S>
void run_trial(S& s, const trial& t, std::string& failure) {
  const int R = t.replicas, N = global_replicas(t), first = me * R;
  auto fail = [&](const std::string& why, const outcome& o) {
    if (failure.empty()) failure = why + "\n  reported: " + (o.text.empty() ? "nothing" : o.text);
  };
  // Span leaves, per step and local replica, so that a refused collective can be seen to change none.
  std::vector<std::vector<std::vector<double>>> spans(t.program.size(), std::vector<std::vector<double>>(static_cast<std::size_t>(R)));
  for (std::size_t k = 0; k < t.program.size(); ++k) {
    for (int r = 0; r < R; ++r) {
      auto& v = spans[k][static_cast<std::size_t>(r)];
      std::size_t n = t.program[k].n;
      if (t.f == fault::wrong_size && static_cast<int>(k) == t.at && first + r == t.who) n += 1;
      v.resize(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = input(t, static_cast<int>(k), first + r, i);
    }
  }
  const auto pristine = spans;
  std::vector<int> wrong(static_cast<std::size_t>(R), 0);
  const std::string thrown = "injected fault, trial " + std::to_string(t.id);
  const bool outside_here = t.f == fault::outside_run && t.who / R == me;
  const bool early_worker = t.f == fault::return_before && R == 1 && t.who == me;
  outcome o, extra;
  if (outside_here) {
    extra = catching([&] {
      switch (t.outside) {
        // (Values built here, not by a run: a run would be this worker's part of the others' run.)
        case 0: {
          std::vector<int> ids(static_cast<std::size_t>(R));
          for (int r = 0; r < R; ++r) ids[static_cast<std::size_t>(r)] = first + r;
          (void)s.reduce(ReduceOp::sum, mirror::PerReplica<int>(ids));
          break;
        }
        case 1: {
          std::vector<std::vector<int>> rows(static_cast<std::size_t>(R), std::vector<int>{first});
          (void)s.gather(mirror::PerReplica<std::vector<int>>(rows), mirror::axis0);
          break;
        }
        case 2: (void)s.broadcast(std::vector<double>{1.0, 2.0}); break;
        default: {
          auto v = s.make_sync_on_read_variable(1.0, mirror::VariableAggregation::sum);  // (its make is collective too)
          (void)v.value();
        }
      }
    });
  }
  {
    o = catching([&] {
      s.run([&](auto& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        const int r = g - first;
        for (int k = 0; k < static_cast<int>(t.program.size()); ++k) {
          step st = t.program[static_cast<std::size_t>(k)];
          if (k == t.at) {
            const bool mine = g == t.who || (t.f == fault::two_throw && g == t.second);
            if (mine && (t.f == fault::throw_before || t.f == fault::two_throw)) throw std::runtime_error(thrown);
            if (g == t.who && t.f == fault::return_before) return;
            if (g == t.who && t.f == fault::wrong_op) st.op = static_cast<ReduceOp>((static_cast<int>(st.op) + 1) % 5);
            if (g == t.who && t.f == fault::wrong_root) st.from = (st.from + 1) % N;
            if (g == t.who && t.f == fault::wrong_kind) {
              st.k = is_reduce(st.k) || st.k == kind::merge || st.k == kind::gather || st.k == kind::reduce_async ||
                             st.k == kind::buckets
                         ? kind::broadcast_span
                         : kind::reduce_span;
            }
          }
          const bool bigger = t.f == fault::wrong_size && k == t.at && g == t.who;
          std::size_t bad = 0;
          auto vec = [&](std::size_t n) {
            std::vector<double> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = input(t, k, g, i);
            return v;
          };
          auto expect = [&](std::size_t i) {
            std::vector<double> x;
            for (int q = 0; q < N; ++q) x.push_back(input(t, k, q, i));
            return reference(st.op, x);
          };
          switch (st.k) {
            case kind::reduce_vector: {
              const auto out = ctx.all_reduce(st.op, vec(st.n + (bigger ? 1 : 0)));
              for (std::size_t i = 0; i < st.n; ++i) bad += same(out->at(i), expect(i)) ? 0 : 1;
              break;
            }
            case kind::reduce_span: {
              auto& mine = spans[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
              ctx.all_reduce(st.op, std::span<double>(mine));
              for (std::size_t i = 0; i < st.n && i < mine.size(); ++i) bad += same(mine[i], expect(i)) ? 0 : 1;
              break;
            }
            case kind::reduce_scalar: {
              const double out = *ctx.all_reduce(st.op, input(t, k, g, 0));
              bad += same(out, expect(0)) ? 0 : 1;
              break;
            }
            case kind::reduce_tuple: {
              std::vector<int> ints(st.n + (bigger ? 1 : 0));
              for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int>(input(t, k, g, i));
              const auto out = ctx.all_reduce(st.op, std::tuple{ints, static_cast<float>(input(t, k, g, 1)), vec(2)});
              for (std::size_t i = 0; i < st.n; ++i) {
                std::vector<int> x;
                for (int q = 0; q < N; ++q) x.push_back(static_cast<int>(input(t, k, q, i)));
                bad += std::get<0>(*out).at(i) == reference(st.op, x) ? 0 : 1;
              }
              std::vector<float> xf;
              for (int q = 0; q < N; ++q) xf.push_back(static_cast<float>(input(t, k, q, 1)));
              bad += same(std::get<1>(*out), reference(st.op, xf)) ? 0 : 1;
              for (std::size_t i = 0; i < 2; ++i) bad += same(std::get<2>(*out).at(i), expect(i)) ? 0 : 1;
              break;
            }
            case kind::broadcast_vector: {
              const auto out = ctx.broadcast(vec(st.n + static_cast<std::size_t>(g)), st.from);  // the source's size wins
              const std::size_t n = st.n + static_cast<std::size_t>(st.from);
              bad += out->size() == n ? 0 : 1;
              for (std::size_t i = 0; i < std::min(n, out->size()); ++i) bad += same(out->at(i), input(t, k, st.from, i)) ? 0 : 1;
              break;
            }
            case kind::broadcast_span: {
              auto& mine = spans[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
              ctx.broadcast(std::span<double>(mine), st.from);
              for (std::size_t i = 0; i < st.n && i < mine.size(); ++i) bad += same(mine[i], input(t, k, st.from, i)) ? 0 : 1;
              break;
            }
            case kind::merge: {
              const auto out = ctx.merge_call(
                  [&](auto& strategy, mirror::PerReplica<double> values) { return strategy.reduce(ReduceOp::sum, values); },
                  input(t, k, g, 0));
              std::vector<double> x;
              for (int q = 0; q < N; ++q) x.push_back(input(t, k, q, 0));
              bad += same(*out, reference(ReduceOp::sum, x)) || (std::isnan(*out) && std::isnan(reference(ReduceOp::sum, x))) ? 0 : 1;
              break;
            }
            case kind::gather: {
              // Replica g contributes st.n + g % 3 elements: the lengths differ.
              const auto out = ctx.all_gather(vec(st.n + static_cast<std::size_t>(g % 3)), mirror::axis0);
              std::size_t at = 0;
              for (int q = 0; q < N; ++q) {
                for (std::size_t i = 0; i < st.n + static_cast<std::size_t>(q % 3); ++i, ++at) {
                  bad += at < out->size() && same(out->at(at), input(t, k, q, i)) ? 0 : 1;
                }
              }
              bad += out->size() == at ? 0 : 1;
              break;
            }
            case kind::reduce_async: {
              auto& mine = spans[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
              auto started = ctx.all_reduce_async(st.op, std::span<double>(mine));
              started.wait();
              for (std::size_t i = 0; i < st.n && i < mine.size(); ++i) bad += same(mine[i], expect(i)) ? 0 : 1;
              break;
            }
            case kind::buckets: {
              // Two leaves, made ready last first; a bucket each (odd n) or one packed bucket.
              const auto second = [&](int q, std::size_t i) { return input(t, k, q, 5000 + i); };
              std::tuple<std::vector<double>, std::vector<double>> grads{vec(st.n + (bigger ? 1 : 0)), {}};
              for (std::size_t i = 0; i < 3; ++i) std::get<1>(grads).push_back(second(g, i));
              auto buckets = ctx.gradient_buckets(st.op, grads, st.n % 2 == 1 ? 0 : std::size_t{1} << 20);
              buckets.ready(1);
              buckets.ready(0);
              buckets.finish();
              for (std::size_t i = 0; i < st.n; ++i) bad += same(std::get<0>(grads).at(i), expect(i)) ? 0 : 1;
              for (std::size_t i = 0; i < 3; ++i) {
                std::vector<double> x;
                for (int q = 0; q < N; ++q) x.push_back(second(q, i));
                bad += same(std::get<1>(grads).at(i), reference(st.op, x)) ? 0 : 1;
              }
              break;
            }
            case kind::scatter: {
              const auto out = ctx.reduce_scatter(st.op, vec(st.n + (bigger ? 1 : 0)));
              const auto [lo, count] = mirror::backend::cut_of(st.n, N, g);
              bad += out.size() == count ? 0 : 1;
              for (std::size_t i = 0; i < std::min(count, out.size()); ++i) bad += same(out[i], expect(lo + i)) ? 0 : 1;
              break;
            }
          }
          wrong[static_cast<std::size_t>(r)] += static_cast<int>(bad);
        }
      });
    });
  }

  // ---- the documented outcome, on this worker ----
  // fn's number of step t.at's (first) collective: a step of gradient buckets makes one per
  // bucket (two where n is odd: a bucket per leaf), and a mismatch in it may be in either.
  const auto collectives = [](const step& st) { return st.k == kind::buckets && st.n % 2 == 1 ? 2 : 1; };
  int number = 1;
  for (int k = 0; k < t.at; ++k) number += collectives(t.program[static_cast<std::size_t>(k)]);
  const std::string numbered = "collective #" + std::to_string(number);
  const std::string numbered_next =
      collectives(t.program[static_cast<std::size_t>(t.at)]) == 2 ? "collective #" + std::to_string(number + 1) : numbered;
  switch (t.f) {
    case fault::none:
      if (o.kind != seen::nothing) fail("a clean run threw", o);
      for (int r = 0; r < R; ++r) {
        if (wrong[static_cast<std::size_t>(r)] != 0) {
          fail("replica " + std::to_string(first + r) + ": " + std::to_string(wrong[static_cast<std::size_t>(r)]) +
                   " results differ from the serial reference",
               o);
        }
      }
      break;
    case fault::throw_before:
    case fault::two_throw: {
      // Two failures in one run: each worker reports the lowest it knows of when its run ends,
      // which may be either (docs/multi-worker.md); one thrower: that one everywhere.
      const bool named = o.replica == t.who || (t.f == fault::two_throw && o.replica == t.second);
      if (o.kind != seen::replica || !named) fail("not a replica_error from replica " + std::to_string(t.who), o);
      if (o.kind == seen::replica && o.replica / R == me && o.nested != thrown) {
        fail("the nested exception is not the original on the thrower's worker", o);
      }
      if (o.text.find(thrown) == std::string::npos) fail("the message does not carry the thrower's", o);
      break;
    }
    case fault::return_before:
      if (early_worker) {
        // Nobody on its worker waits for it: this run returns, and its next run (the first
        // follow-up, below) meets the others' run.
        if (o.kind != seen::nothing) fail("the early worker's own run threw", o);
        break;
      }
      if (o.kind != seen::timeout || o.missing != std::vector<int>{t.who}) {
        fail("not a timeout_error missing {" + std::to_string(t.who) + "}", o);
      }
      break;
    case fault::outside_run:
      if (outside_here) {
        // The extra call meets the others' run; this worker's own run is then refused with the
        // same error: its match, the others' run, has failed.
        if (extra.kind != seen::shape) fail("the call outside run: not a shape_error", extra);
        // (A bucket adds its leaves to the error's text: the same error, with more said.)
        if (o.kind != seen::shape || o.text.find(extra.text) == std::string::npos) {
          fail("the run after the call outside run was not refused", o);
        }
        o = extra;
      }
      if (o.kind != seen::shape) fail("not a shape_error", o);
      if (o.text.find("called outside fn") == std::string::npos || o.text.find("of fn") == std::string::npos) {
        fail("the shape_error does not name both calls", o);
      }
      break;
    default:  // a disagreement
      if (o.kind != seen::shape) fail("not a shape_error", o);
      if (o.text.find(numbered) == std::string::npos && o.text.find(numbered_next) == std::string::npos) {
        fail("the shape_error does not name " + numbered, o);
      }
      for (int r = 0; r < R; ++r) {  // bit for bit: the inputs hold NaNs
        const auto& now = spans[static_cast<std::size_t>(t.at)][static_cast<std::size_t>(r)];
        const auto& before = pristine[static_cast<std::size_t>(t.at)][static_cast<std::size_t>(r)];
        if (now.size() != before.size() ||
            (!now.empty() && std::memcmp(now.data(), before.data(), now.size() * sizeof(double)) != 0)) {
          fail("a refused collective changed replica " + std::to_string(first + r) + "'s span leaf", o);
        }
      }
      break;
  }
  // ---- the runs after it: every worker makes the same three ----
  // Run j's values differ from every other run's, so a run paired with another's is off.
  std::vector<outcome> after;
  for (int j = 1; j <= 3; ++j) {
    const auto value = [&](int g, std::size_t i) {
      return static_cast<int>((t.id * 7919u + static_cast<std::uint64_t>(j) * 104729u +
                               static_cast<std::uint64_t>(g) * 31u + i) % 100000u);
    };
    after.push_back(catching([&] {
      const auto got = s.run([&](auto& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        return ctx.all_reduce(ReduceOp::sum, std::vector<int>{value(g, 0), value(g, 1), value(g, 2)});
      });
      for (int r = 0; r < R; ++r) {
        for (std::size_t i = 0; i < 3; ++i) {
          int want = 0;
          for (int q = 0; q < N; ++q) want += value(q, i);
          if (got[r].at(i) != want) {
            throw std::logic_error("follow-up run " + std::to_string(j) + ": replica " + std::to_string(first + r) +
                                   " got " + std::to_string(got[r].at(i)) + " for element " + std::to_string(i) +
                                   ", the serial sum is " + std::to_string(want) +
                                   " (paired with another run's collective)");
          }
        }
      }
    }));
  }
  // Where a whole worker returned early, the first follow-up is that worker's next run: it
  // meets the others' trial run (the error), and the others' first follow-up is refused with
  // it. Every other follow-up returns, exact.
  const bool spoiled_first = t.f == fault::return_before && R == 1;
  if (spoiled_first) {
    if (early_worker) o = after[0];
    if (after[0].kind != seen::timeout || after[0].missing != std::vector<int>{t.who}) {
      fail("the first run after a worker's early return: not a timeout_error missing {" + std::to_string(t.who) + "}",
           after[0]);
    }
    if (!early_worker && o.kind == seen::timeout && o.text.find(after[0].text) == std::string::npos) {
      fail("the refused run's error is not the trial run's", after[0]);
    }
  }
  for (std::size_t j = spoiled_first ? 1 : 0; j < after.size(); ++j) {
    if (after[j].kind != seen::nothing) fail("follow-up run " + std::to_string(j + 1) + " failed", after[j]);
  }
  // ---- every worker reported the same ----
  std::int64_t mine[4] = {static_cast<std::int64_t>(o.kind), o.replica, static_cast<std::int64_t>(o.missing.size()),
                          o.missing.empty() ? -1 : o.missing.front()};
  std::vector<std::int64_t> all(4 * static_cast<std::size_t>(W));
  MPI_Allgather(mine, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, MPI_COMM_WORLD);
  const bool thrown_apart = t.f == fault::two_throw;
  for (int p = 1; p < W; ++p) {
    const std::int64_t* a = &all[0];
    const std::int64_t* b = &all[4 * static_cast<std::size_t>(p)];
    if (a[0] != b[0] || a[2] != b[2] || a[3] != b[3] || (!thrown_apart && a[1] != b[1])) {
      fail("worker " + std::to_string(p) + " reported another outcome than worker 0", o);
    }
  }
}

// ---------------- strategies, kept between trials ----------------

// One strategy alive at a time, as in tests/mpi/cluster_test.cpp (which says why): a second
// strategy's idle communication thread would advance this one's MPI collectives, an order
// ThreadSanitizer cannot see. Kept while the trials use the same policy and replica count.
template <class Ops>
struct cache {
  std::unique_ptr<mirror::Strategy<Cluster, Ops>> strategy;
  int replicas = 0;
  mirror::Strategy<Cluster, Ops>& get(int r, Ops ops) {
    if (!strategy || replicas != r) {
      strategy.reset();
      strategy = std::make_unique<mirror::Strategy<Cluster, Ops>>(Cluster{.local = {.replicas = r}, .timeout = 60s}, ops);
      replicas = r;
    }
    return *strategy;
  }
  void drop() { strategy.reset(); }
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const mirror::test::trial_options options = mirror::test::parse_trial_options(
      argc, argv,
      "usage: mpirun -np W cluster_fault_injection [--trials N] [--seed S] [--first T] [--hang-seconds H] [--verbose]",
      [](const std::string&, mirror::test::trial_options&) { return false; });
  const std::uint64_t trials = options.trials, seed = options.seed, first = options.first;
  const double hang_seconds = options.hang_seconds;
  const bool verbose = options.verbose;
  std::thread dog(watchdog, hang_seconds);
  using Default = mirror::ops::Hierarchical<mirror::ops::ChunkOwnerAllReduce, mirror::ops::MpiAllReduce>;
  using Ordered = mirror::ops::Hierarchical<mirror::ops::ReductionToOneDevice, mirror::ops::MpiAllReduce>;
  std::map<std::string, int> by_fault;
  std::uint64_t failures = 0;
  const auto start = std::chrono::steady_clock::now();
  {
    cache<Default> plain;
    cache<Ordered> ordered;
    // Trials grouped by policy and replica count (each keeps its id, so a replay is the same),
    // so that the one live strategy is rebuilt a handful of times, not at most trials.
    std::vector<std::pair<std::uint64_t, trial>> order;
    for (std::uint64_t id = first; id < first + trials; ++id) order.emplace_back(id, make_trial(seed, id));
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return std::pair{a.second.policy, a.second.replicas} < std::pair{b.second.policy, b.second.replicas};
    });
    for (const auto& [id, t] : order) {
      {
        std::lock_guard lock(current_mutex);
        current_trial = "seed " + std::to_string(seed) + ", " + describe(t);
      }
      if (verbose && me == 0) std::printf("%s\n", current_trial.c_str());
      trial_started_ns = now_ns();
      std::string failure;
      if (t.policy == 0) {
        ordered.drop();
        run_trial(plain.get(t.replicas, {}), t, failure);
      } else {
        plain.drop();
        run_trial(ordered.get(t.replicas, {.cross = {.deterministic = true}}), t, failure);
      }
      trial_started_ns = 0;
      ++by_fault[name(t.f)];
      // Every worker stops together after the tenth failure anywhere.
      std::int64_t failed = failure.empty() ? 0 : 1, any = 0;
      MPI_Allreduce(&failed, &any, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      if (!failure.empty()) {
        std::printf("FAILED on worker %d: seed %llu, %s\n  %s\n  replay: mpirun -np %d ... --seed %llu --first %llu "
                    "--trials 1\n",
                    me, static_cast<unsigned long long>(seed), describe(t).c_str(), failure.c_str(), W,
                    static_cast<unsigned long long>(seed), static_cast<unsigned long long>(id));
        std::fflush(stdout);
      }
      if (any != 0) ++failures;
      if (failures >= 10) break;
    }
  }
  watching = false;
  dog.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (me == 0) {
    std::printf("cluster_fault_injection: %llu trials on %d workers (seed %llu, from %llu) in %.1f s:",
                static_cast<unsigned long long>(trials), W, static_cast<unsigned long long>(seed),
                static_cast<unsigned long long>(first), seconds);
    for (const auto& [f, n] : by_fault) std::printf(" %s %d;", f.c_str(), n);
    std::printf(" %llu failed\n", static_cast<unsigned long long>(failures));
    std::fflush(stdout);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
