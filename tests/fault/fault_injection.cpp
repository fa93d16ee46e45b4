// SPDX-License-Identifier: Apache-2.0
// Randomized fault injection: trials of `run` with random replica counts, devices,
// ops policies and programs of collectives, most with one injected fault, each outcome checked
// against what docs/errors.md and docs/guide.md#errors promise, and every clean result against a
// serial reference. Written from the documentation, not from the implementation:
//   - no fault: every collective's result on every replica is the serial loop's (inputs are
//     small integers, exact in any order; min and max see NaNs and signed zeros, whose result
//     does not depend on the order either: mirror/reduce_op.hpp);
//   - a replica throws before collective k: run throws replica_error naming it (the lowest, when
//     two throw), with the original nested; every other replica's collective k is cancelled
//     (an exception that is not a std::exception);
//   - a replica returns before collective k: run throws timeout_error, missing() == {it}, and
//     every other replica throws that same error, naming collective #k as fn wrote it;
//   - a replica passes another size, op, root or collective at k: shape_error on every
//     replica, naming collective #k, and no span leaf changes;
//   - a replica arrives at k only after the others timed out: timeout_error naming it;
//   - after every trial the strategy still works.
// A watchdog thread turns a trial that hangs into a failure that prints each replica's position.
//
//   fault_injection [--trials N] [--seed S] [--first T] [--hang-seconds H] [--verbose]
//   fault_injection --selftest-hang [--hang-seconds H]   (the watchdog's own test: a replica that
//                                                        never reaches its collective; exits 3)
//
// Trial t uses the random stream (S, t), so `--first T --trials 1` replays one. The test suite
// runs a few hundred trials (suite 'fault'); a release runs `--trials 100000` (docs/design.md).
#include <algorithm>
#include <array>
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
#include "support/fake_device.hpp"

namespace {

using mirror::ReduceOp;
using mirror::test::reference;
using mirror::test::same;
using namespace std::chrono_literals;

constexpr int max_replicas = 16;

// ---------------- the program of one trial ----------------

enum class kind { reduce_vector, reduce_span, reduce_scalar, reduce_tuple, broadcast_vector, broadcast_span, merge };
const char* name(kind k) {
  switch (k) {
    case kind::reduce_vector: return "all_reduce(vector)";
    case kind::reduce_span: return "all_reduce(span)";
    case kind::reduce_scalar: return "all_reduce(double)";
    case kind::reduce_tuple: return "all_reduce(tuple)";
    case kind::broadcast_vector: return "broadcast(vector)";
    case kind::broadcast_span: return "broadcast(span)";
    case kind::merge: return "merge_call";
  }
  return "?";
}
bool is_reduce(kind k) { return k <= kind::reduce_tuple; }

struct step {
  kind k;
  ReduceOp op = ReduceOp::sum;
  std::size_t n = 1;  // elements of the vector/span leaf
  int from = 0;       // broadcast's source
};

enum class fault { none, throw_before, two_throw, return_before, wrong_size, wrong_op, wrong_root, wrong_kind, late };
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
    case fault::late: return "late";
  }
  return "?";
}

struct trial {
  std::uint64_t id = 0;
  int device = 0;   // 0 Threads, 1 FakeDevice
  int policy = 0;   // 0 ChunkOwnerAllReduce (Threads only), 1 ReductionToOneDevice, 2 HierarchicalCopy
  int param = 0;    // reduce_to or num_packs
  int replicas = 1;
  std::vector<step> program;
  fault f = fault::none;
  int who = 0, second = 0;  // the faulty replica(s)
  int at = 0;               // before which step (0-based)
};

// Replica r's input element i of step s of trial t: small integers (exact in any order), and for
// min and max also NaNs and zeros of both signs now and then.
double input(const trial& t, int s, int r, std::size_t i) {
  const step& st = t.program[static_cast<std::size_t>(s)];
  const std::uint64_t h = (t.id * 1000003u + static_cast<std::uint64_t>(s) * 7919u + static_cast<std::uint64_t>(r) * 131u +
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
  t.device = pick(4) == 0 ? 1 : 0;
  t.policy = t.device == 1 ? 1 + pick(2) : pick(3);
  static constexpr int counts[] = {1, 2, 2, 3, 3, 4, 5, 7, 8, 13, 16};
  t.replicas = counts[pick(static_cast<int>(std::size(counts)))];
  t.param = t.policy == 1 ? pick(t.replicas) : t.policy == 2 ? pick(4) : 0;
  const int steps = 1 + pick(5);
  for (int s = 0; s < steps; ++s) {
    step st;
    st.k = static_cast<kind>(pick(7));
    st.op = static_cast<ReduceOp>(pick(5));
    st.n = pick(4) == 0 ? static_cast<std::size_t>(1 + pick(5000)) : static_cast<std::size_t>(1 + pick(20));
    st.from = pick(t.replicas);
    t.program.push_back(st);
  }
  // A fault in 3 trials of 4 (none where there is no other replica to see it, but a throw).
  const int choice = pick(16);
  t.at = pick(steps);
  t.who = pick(t.replicas);
  t.second = pick(t.replicas);
  const step& st = t.program[static_cast<std::size_t>(t.at)];
  if (choice < 4) {
    t.f = fault::none;
  } else if (choice < 7 || t.replicas == 1) {
    t.f = t.replicas == 1 && choice >= 7 ? fault::none : fault::throw_before;
  } else if (choice == 7) {
    t.f = t.second != t.who ? fault::two_throw : fault::throw_before;
  } else if (choice < 10) {
    t.f = fault::return_before;
  } else if (choice == 10) {
    t.f = is_reduce(st.k) && st.k != kind::reduce_scalar ? fault::wrong_size
          : st.k == kind::broadcast_span                   ? fault::wrong_size
                                                           : fault::wrong_kind;
  } else if (choice == 11) {
    t.f = is_reduce(st.k) ? fault::wrong_op : fault::wrong_kind;
  } else if (choice == 12) {
    t.f = (st.k == kind::broadcast_vector || st.k == kind::broadcast_span) ? fault::wrong_root : fault::wrong_kind;
  } else if (choice < 15 || pick(2) == 0) {
    t.f = fault::wrong_kind;
  } else {
    // Late beyond the (short) timeout, at the first collective: before it nothing else can be
    // slow enough to time out.
    t.f = fault::late;
    t.at = 0;
  }
  return t;
}

std::string describe(const trial& t) {
  static const char* devices[] = {"Threads", "FakeDevice"};
  static const char* policies[] = {"ChunkOwnerAllReduce", "ReductionToOneDevice", "HierarchicalCopy"};
  std::string s = "trial " + std::to_string(t.id) + ": " + devices[t.device] + " x " + std::to_string(t.replicas) + ", " +
                  policies[t.policy] + "(" + std::to_string(t.param) + "), ";
  if (t.f == fault::none) {
    s += "no fault";
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

struct position {
  std::atomic<int> step{0};   // 1-based collective it is in or before
  std::atomic<int> state{0};  // 0 computing, 1 in the collective, 2 returned, 3 threw
};
std::array<position, max_replicas> positions;
std::atomic<std::int64_t> trial_started_ns{0};
std::atomic<int> trial_replicas{0};
std::atomic<bool> watching{true};
bool selftest_hang = false;  // --selftest-hang: replica 0 of the first trial never reaches a collective
std::mutex current_mutex;
std::string current_trial;  // describe() of the trial being run

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void watchdog(double hang_seconds) {
  while (watching.load()) {
    std::this_thread::sleep_for(100ms);
    const std::int64_t started = trial_started_ns.load();
    if (started == 0 || now_ns() - started < static_cast<std::int64_t>(hang_seconds * 1e9)) continue;
    std::lock_guard lock(current_mutex);
    std::fprintf(stderr, "fault_injection: HANG: %s\nran for more than %.0f s; each replica's position:\n",
                 current_trial.c_str(), hang_seconds);
    static const char* states[] = {"computing before", "in", "returned from fn after", "threw out of fn at"};
    for (int r = 0; r < trial_replicas.load(); ++r) {
      std::fprintf(stderr, "  replica %d: %s collective #%d\n", r, states[positions[static_cast<std::size_t>(r)].state.load()],
                   positions[static_cast<std::size_t>(r)].step.load());
    }
    std::fflush(stderr);
    std::_Exit(3);
  }
}

// ---------------- one trial on one strategy ----------------

// What a replica saw at the collective where it stopped.
enum class seen { nothing, cancelled, timeout, shape, other, unexpected };

struct outcome {
  std::vector<seen> saw;
  std::vector<std::string> text;  // what() of what it saw
  std::vector<int> wrong_values;  // per replica: results that differ from the reference
  std::vector<int> stopped_at;    // per replica: 1-based collective where it stopped (0: none)
};

template <class S>
void run_trial(S& s, const trial& t, outcome& o, std::string& failure) {
  const int R = t.replicas;
  o.saw.assign(static_cast<std::size_t>(R), seen::nothing);
  o.text.assign(static_cast<std::size_t>(R), {});
  o.wrong_values.assign(static_cast<std::size_t>(R), 0);
  o.stopped_at.assign(static_cast<std::size_t>(R), 0);
  for (int r = 0; r < max_replicas; ++r) {
    positions[static_cast<std::size_t>(r)].step = 0;
    positions[static_cast<std::size_t>(r)].state = 0;
  }
  // Span leaves live here, so that a refused collective can be seen to change none of them.
  std::vector<std::vector<std::vector<double>>> spans(t.program.size(), std::vector<std::vector<double>>(static_cast<std::size_t>(R)));
  for (std::size_t s2 = 0; s2 < t.program.size(); ++s2) {
    for (int r = 0; r < R; ++r) {
      auto& v = spans[s2][static_cast<std::size_t>(r)];
      std::size_t n = t.program[s2].n;
      if (t.f == fault::wrong_size && static_cast<int>(s2) == t.at && r == t.who) n += 1;
      v.resize(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = input(t, static_cast<int>(s2), r, i);
    }
  }
  const auto pristine = spans;
  std::atomic<int> timed_out{0};
  const std::string thrown = "injected fault, trial " + std::to_string(t.id);
  std::string reported;
  seen reported_kind = seen::nothing;
  int reported_replica = -1;
  std::vector<int> reported_missing;
  std::string nested;
  try {
    s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      position& me = positions[static_cast<std::size_t>(r)];
      for (int k = 0; k < static_cast<int>(t.program.size()); ++k) {
        step st = t.program[static_cast<std::size_t>(k)];
        me.step = k + 1;
        if (selftest_hang && r == 0) {
          for (;;) std::this_thread::sleep_for(1s);  // hangs: the watchdog must end the program
        }
        if (k == t.at) {
          const bool mine = r == t.who || (t.f == fault::two_throw && r == t.second);
          if (mine && (t.f == fault::throw_before || t.f == fault::two_throw)) {
            me.state = 3;
            throw std::runtime_error(thrown);
          }
          if (r == t.who && t.f == fault::return_before) {
            me.state = 2;
            return;
          }
          if (r == t.who && t.f == fault::wrong_op) st.op = static_cast<ReduceOp>((static_cast<int>(st.op) + 1) % 5);
          if (r == t.who && t.f == fault::wrong_root) st.from = (st.from + 1) % R;
          if (r == t.who && t.f == fault::wrong_kind) {
            st.k = is_reduce(st.k) || st.k == kind::merge ? kind::broadcast_vector : kind::reduce_vector;
          }
          if (r == t.who && t.f == fault::late) {
            while (timed_out.load() < R - 1) std::this_thread::yield();  // after every other replica gave up
          }
        }
        me.state = 1;
        try {
          std::size_t wrong = 0;
          auto vec = [&](std::size_t n) {
            std::vector<double> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = input(t, k, r, i);
            return v;
          };
          auto expect = [&](std::size_t i) {
            std::vector<double> x;
            for (int q = 0; q < R; ++q) x.push_back(input(t, k, q, i));
            return reference(st.op, x);
          };
          switch (st.k) {
            case kind::reduce_vector: {
              const auto out = ctx.all_reduce(st.op, vec(st.n + (t.f == fault::wrong_size && k == t.at && r == t.who ? 1 : 0)));
              for (std::size_t i = 0; i < st.n; ++i) wrong += same(out->at(i), expect(i)) ? 0 : 1;
              break;
            }
            case kind::reduce_span: {
              auto& mine = spans[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
              ctx.all_reduce(st.op, std::span<double>(mine));
              for (std::size_t i = 0; i < st.n; ++i) wrong += same(mine[i], expect(i)) ? 0 : 1;
              break;
            }
            case kind::reduce_scalar: {
              const double out = *ctx.all_reduce(st.op, input(t, k, r, 0));
              wrong += same(out, expect(0)) ? 0 : 1;
              break;
            }
            case kind::reduce_tuple: {
              // An int leaf, a float leaf and a double leaf: each element type its own fused collective.
              std::vector<int> ints(st.n + (t.f == fault::wrong_size && k == t.at && r == t.who ? 1 : 0));
              for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int>(input(t, k, r, i));
              auto v = std::tuple{ints, static_cast<float>(input(t, k, r, 1)), vec(2)};
              const auto out = ctx.all_reduce(st.op, v);
              for (std::size_t i = 0; i < st.n; ++i) {
                std::vector<int> x;
                for (int q = 0; q < R; ++q) x.push_back(static_cast<int>(input(t, k, q, i)));
                wrong += std::get<0>(*out).at(i) == reference(st.op, x) ? 0 : 1;
              }
              std::vector<float> xf;
              for (int q = 0; q < R; ++q) xf.push_back(static_cast<float>(input(t, k, q, 1)));
              wrong += same(std::get<1>(*out), reference(st.op, xf)) ? 0 : 1;
              for (std::size_t i = 0; i < 2; ++i) wrong += same(std::get<2>(*out).at(i), expect(i)) ? 0 : 1;
              break;
            }
            case kind::broadcast_vector: {
              const auto out = ctx.broadcast(vec(st.n + static_cast<std::size_t>(r)), st.from);  // sizes differ: the source's wins
              const std::size_t n = st.n + static_cast<std::size_t>(st.from);
              wrong += out->size() == n ? 0 : 1;
              for (std::size_t i = 0; i < std::min(n, out->size()); ++i) wrong += same(out->at(i), input(t, k, st.from, i)) ? 0 : 1;
              break;
            }
            case kind::broadcast_span: {
              auto& mine = spans[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
              ctx.broadcast(std::span<double>(mine), st.from);
              for (std::size_t i = 0; i < st.n; ++i) wrong += same(mine[i], input(t, k, st.from, i)) ? 0 : 1;
              break;
            }
            case kind::merge: {
              const auto out = ctx.merge_call(
                  [&](auto& strategy, mirror::PerReplica<double> values) { return strategy.reduce(ReduceOp::sum, values); },
                  input(t, k, r, 0));
              double sum = input(t, k, 0, 0);  // (not 0 + ...: that would turn a lone -0 into +0)
              for (int q = 1; q < R; ++q) sum += input(t, k, q, 0);
              // (sum of NaN-free small integers: exact; a min/max step's NaN input is only used here as a sum)
              wrong += same(*out, sum) || (std::isnan(*out) && std::isnan(sum)) ? 0 : 1;
              break;
            }
          }
          o.wrong_values[static_cast<std::size_t>(r)] += static_cast<int>(wrong);
        } catch (const mirror::timeout_error& e) {
          o.saw[static_cast<std::size_t>(r)] = seen::timeout;
          o.text[static_cast<std::size_t>(r)] = e.what();
          o.stopped_at[static_cast<std::size_t>(r)] = k + 1;
          me.state = 3;
          ++timed_out;
          throw;
        } catch (const mirror::shape_error& e) {
          o.saw[static_cast<std::size_t>(r)] = seen::shape;
          o.text[static_cast<std::size_t>(r)] = e.what();
          o.stopped_at[static_cast<std::size_t>(r)] = k + 1;
          me.state = 3;
          throw;
        } catch (const std::exception& e) {
          o.saw[static_cast<std::size_t>(r)] = seen::other;
          o.text[static_cast<std::size_t>(r)] = e.what();
          o.stopped_at[static_cast<std::size_t>(r)] = k + 1;
          me.state = 3;
          throw;
        } catch (...) {
          o.saw[static_cast<std::size_t>(r)] = seen::cancelled;  // mirror's cancellation: rethrow it
          o.stopped_at[static_cast<std::size_t>(r)] = k + 1;
          me.state = 3;
          throw;
        }
        me.state = 0;
      }
      me.state = 2;
    });
  } catch (const mirror::replica_error& e) {
    reported_kind = seen::other;
    reported = e.what();
    reported_replica = e.replica();
    try {
      e.rethrow_nested();
    } catch (const std::exception& original) {
      nested = original.what();
    } catch (...) {
    }
  } catch (const mirror::timeout_error& e) {
    reported_kind = seen::timeout;
    reported = e.what();
    reported_missing = e.missing();
  } catch (const mirror::shape_error& e) {
    reported_kind = seen::shape;
    reported = e.what();
  } catch (const std::exception& e) {
    reported_kind = seen::unexpected;
    reported = std::string("unexpected exception: ") + e.what();
  }

  // ---- the documented outcome ----
  auto fail = [&](const std::string& why) {
    if (failure.empty()) failure = why + "\n  run reported: " + (reported.empty() ? "nothing" : reported);
  };
  const std::string numbered = "collective #" + std::to_string(t.at + 1);
  switch (t.f) {
    case fault::none:
      if (reported_kind != seen::nothing) fail("a clean run threw");
      for (int r = 0; r < R; ++r) {
        if (o.wrong_values[static_cast<std::size_t>(r)] != 0) {
          fail("replica " + std::to_string(r) + ": " + std::to_string(o.wrong_values[static_cast<std::size_t>(r)]) +
               " results differ from the serial reference");
        }
      }
      break;
    case fault::throw_before:
    case fault::two_throw: {
      const int lowest = t.f == fault::two_throw ? std::min(t.who, t.second) : t.who;
      if (reported_kind != seen::other || reported_replica != lowest) fail("not replica_error from replica " + std::to_string(lowest));
      if (nested != thrown) fail("the nested exception is not the original");
      for (int r = 0; r < R; ++r) {
        if (r == t.who || (t.f == fault::two_throw && r == t.second)) continue;
        if (o.saw[static_cast<std::size_t>(r)] != seen::cancelled || o.stopped_at[static_cast<std::size_t>(r)] != t.at + 1) {
          fail("replica " + std::to_string(r) + " was not cancelled in " + numbered);
        }
      }
      break;
    }
    case fault::return_before:
    case fault::late:
      if (reported_kind != seen::timeout || reported_missing != std::vector<int>{t.who}) {
        fail("not a timeout_error missing {" + std::to_string(t.who) + "}");
      }
      if (reported.find(numbered) == std::string::npos) fail("the timeout does not name " + numbered);
      for (int r = 0; r < R; ++r) {
        if (r == t.who && t.f == fault::return_before) continue;
        if (o.saw[static_cast<std::size_t>(r)] != seen::timeout || o.text[static_cast<std::size_t>(r)] != reported) {
          fail("replica " + std::to_string(r) + " did not throw the run's timeout_error");
        }
      }
      break;
    default:  // a disagreement
      if (reported_kind != seen::shape) fail("not a shape_error");
      if (reported.find(numbered) == std::string::npos) fail("the shape_error does not name " + numbered);
      for (int r = 0; r < R; ++r) {
        if (o.saw[static_cast<std::size_t>(r)] != seen::shape || o.stopped_at[static_cast<std::size_t>(r)] != t.at + 1) {
          fail("replica " + std::to_string(r) + " did not get the shape_error at " + numbered);
        }
      }
      for (int r = 0; r < R; ++r) {  // bit for bit: the inputs hold NaNs
        const auto& now = spans[static_cast<std::size_t>(t.at)][static_cast<std::size_t>(r)];
        const auto& before = pristine[static_cast<std::size_t>(t.at)][static_cast<std::size_t>(r)];
        if (now.size() != before.size() || std::memcmp(now.data(), before.data(), now.size() * sizeof(double)) != 0) {
          fail("a refused collective changed replica " + std::to_string(r) + "'s span leaf");
        }
      }
      break;
  }
  // The strategy goes on.
  try {
    const auto ok = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
    if (ok.primary() != R) fail("the next run's sum is wrong");
  } catch (const std::exception& e) {
    fail(std::string("the next run threw: ") + e.what());
  }
}

// ---------------- strategies, kept between trials ----------------

template <class Device, class Ops>
struct cache {
  struct entry {
    int replicas, param;
    bool short_timeout;
    std::unique_ptr<mirror::Strategy<Device, Ops>> s;
  };
  std::vector<entry> entries;  // the most recent last
  mirror::Strategy<Device, Ops>& get(int replicas, Ops ops, int param, bool short_timeout) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].replicas == replicas && entries[i].param == param && entries[i].short_timeout == short_timeout) {
        std::rotate(entries.begin() + static_cast<std::ptrdiff_t>(i), entries.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                    entries.end());
        return *entries.back().s;
      }
    }
    if (entries.size() >= 4) entries.erase(entries.begin());  // few pools alive at once
    Device d{};
    d.replicas = replicas;
    d.timeout = short_timeout ? std::chrono::milliseconds(500) : std::chrono::milliseconds(60000);
    entries.push_back({replicas, param, short_timeout, std::make_unique<mirror::Strategy<Device, Ops>>(d, ops)});
    return *entries.back().s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const mirror::test::trial_options options = mirror::test::parse_trial_options(
      argc, argv,
      "usage: fault_injection [--trials N] [--seed S] [--first T] [--hang-seconds H] [--verbose] [--selftest-hang]",
      [](const std::string& flag, mirror::test::trial_options& o) {
        if (flag != "--selftest-hang") return false;
        selftest_hang = true;
        o.trials = 1;
        return true;
      });
  const std::uint64_t trials = options.trials, seed = options.seed, first = options.first;
  const double hang_seconds = options.hang_seconds;
  const bool verbose = options.verbose;
  std::thread dog(watchdog, hang_seconds);
  using Threads = mirror::devices::Threads;
  using Fake = mirror::test::FakeDevice;
  cache<Threads, mirror::ops::ChunkOwnerAllReduce> chunk_owner;
  cache<Threads, mirror::ops::ReductionToOneDevice> to_one;
  cache<Threads, mirror::ops::HierarchicalCopy> tree;
  cache<Fake, mirror::ops::ReductionToOneDevice> fake_to_one;
  cache<Fake, mirror::ops::HierarchicalCopy> fake_tree;
  std::map<std::string, int> by_fault;
  std::uint64_t failures = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t id = first; id < first + trials; ++id) {
    trial t = make_trial(seed, id);
    if (selftest_hang) {  // four replicas on the default policy, no fault but the hang
      t.device = t.policy = t.param = 0;
      t.replicas = 4;
      t.f = fault::none;
      for (step& st : t.program) st.from %= 4;
    }
    {
      std::lock_guard lock(current_mutex);
      current_trial = "seed " + std::to_string(seed) + ", " + describe(t);
    }
    if (verbose) std::printf("%s\n", current_trial.c_str());
    trial_replicas = t.replicas;
    trial_started_ns = now_ns();
    outcome o;
    std::string failure;
    const bool short_timeout = t.f == fault::late;
    if (t.device == 0 && t.policy == 0) {
      run_trial(chunk_owner.get(t.replicas, {}, 0, short_timeout), t, o, failure);
    } else if (t.device == 0 && t.policy == 1) {
      run_trial(to_one.get(t.replicas, {.reduce_to = t.param}, t.param, short_timeout), t, o, failure);
    } else if (t.device == 0) {
      run_trial(tree.get(t.replicas, {.num_packs = t.param}, t.param, short_timeout), t, o, failure);
    } else if (t.policy == 1) {
      run_trial(fake_to_one.get(t.replicas, {.reduce_to = t.param}, t.param, short_timeout), t, o, failure);
    } else {
      run_trial(fake_tree.get(t.replicas, {.num_packs = t.param}, t.param, short_timeout), t, o, failure);
    }
    trial_started_ns = 0;
    ++by_fault[name(t.f)];
    if (!failure.empty()) {
      ++failures;
      std::printf("FAILED: seed %llu, %s\n  %s\n  replay: --seed %llu --first %llu --trials 1\n",
                  static_cast<unsigned long long>(seed), describe(t).c_str(), failure.c_str(),
                  static_cast<unsigned long long>(seed), static_cast<unsigned long long>(id));
      if (failures >= 10) break;
    }
  }
  watching = false;
  dog.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fault_injection: %llu trials (seed %llu, from %llu) in %.1f s:", static_cast<unsigned long long>(trials),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(first), seconds);
  for (const auto& [f, n] : by_fault) std::printf(" %s %d;", f.c_str(), n);
  std::printf(" %llu failed\n", static_cast<unsigned long long>(failures));
  return failures == 0 ? 0 : 1;
}
