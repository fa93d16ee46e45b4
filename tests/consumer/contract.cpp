// A consumer written only against the public contract (docs/design.md#the-public-contract): every
// result is checked against a value computed here, serially, from the inputs. Exit 0 and one
// summary line on success; exit 1 and a message naming the first mismatch otherwise.
#include <mirror/mirror.hpp>

#include <boost/hana/define_struct.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

struct Grads {  // a Hana struct is a nest
  BOOST_HANA_DEFINE_STRUCT(Grads, (std::vector<float>, w), (double, b), (std::array<int, 3>, c));
};

namespace {

using mirror::ReduceOp;
int checks = 0;

#define EXPECT(cond, what)                                                                 \
  do {                                                                                     \
    ++checks;                                                                              \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "contract: FAIL [%s, %d replicas] %s (line %d)\n", name, R, what, \
                   __LINE__);                                                              \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// The serial reference: fold replicas 0..R-1 in order, then divide for mean (in the element type).
template <class E, class F>
E fold(ReduceOp op, int R, F value_of) {
  E acc = value_of(0);
  for (int r = 1; r < R; ++r) {
    const E x = value_of(r);
    acc = op == ReduceOp::min ? (x < acc ? x : acc) : op == ReduceOp::max ? (acc < x ? x : acc)
        : op == ReduceOp::prod ? E(acc * x) : E(acc + x);
  }
  return op == ReduceOp::mean ? E(acc / E(R)) : acc;
}

// Replica r's w[i]: small integers, so every op (prod of 5 replicas too) is exact in float.
float wv(int r, int i) { return float((r * 3 + i) % 11 + 1); }

Grads grads_of(int r, int n) {
  Grads g{std::vector<float>(static_cast<std::size_t>(n)), 0.5 * r, {r, 2 * r + 1, 3 - r}};
  for (int i = 0; i < n; ++i) g.w[static_cast<std::size_t>(i)] = wv(r, i);
  return g;
}

template <class Strategy>
int check(const char* name, Strategy& s) {
  const int R = s.num_replicas_in_sync();
  constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::mean, ReduceOp::min, ReduceOp::max, ReduceOp::prod};

  // run: T -> PerReplica<T>, Synced<T> -> Mirrored<T>, std::tuple lifted element by element.
  auto [ids, total] = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return std::tuple{id, ctx.all_reduce(ReduceOp::sum, id)};
  });
  EXPECT(ids.size() == std::size_t(R) && total.size() == std::size_t(R), "run result sizes");
  for (int r = 0; r < R; ++r) EXPECT(ids[std::size_t(r)] == r && total[std::size_t(r)] == R * (R - 1) / 2, "run ids / all_reduce(int)");
  EXPECT(total.primary() == R * (R - 1) / 2, "Mirrored::primary");
  EXPECT(s.reduce(ReduceOp::mean, ids) == (R * (R - 1) / 2) / R, "integer mean truncates");
  EXPECT(s.reduce(ReduceOp::sum, total) == R * (R * (R - 1) / 2), "reduce(sum, Mirrored) counts every copy");

  // all_reduce of a Hana struct (every op), std::pair and std::array-of-nests; strategy.reduce of the same.
  for (ReduceOp op : all_ops) {
    auto [per, red] = s.run([op](auto& ctx) {
      Grads g = grads_of(ctx.replica_id_in_sync_group(), 37);
      return std::pair{g, ctx.all_reduce(op, g)};
    });
    const Grads host = s.reduce(op, per);
    for (int r = 0; r < R; ++r) {
      const Grads& got = red[std::size_t(r)];
      for (int i = 0; i < 37; ++i) {
        const float want = fold<float>(op, R, [&](int q) { return wv(q, i); });
        EXPECT(got.w[std::size_t(i)] == want && host.w[std::size_t(i)] == want, "struct leaf w");
      }
      EXPECT(got.b == fold<double>(op, R, [](int q) { return 0.5 * q; }) && host.b == got.b, "struct leaf b");
      for (int j = 0; j < 3; ++j) {
        const int want = fold<int>(op, R, [&](int q) { return grads_of(q, 0).c[std::size_t(j)]; });
        EXPECT(got.c[std::size_t(j)] == want && host.c[std::size_t(j)] == want, "struct leaf c (int)");
      }
    }
  }
  using Nested = std::array<std::pair<long, std::vector<double>>, 2>;
  auto nested = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    Nested n{{{id, std::vector<double>(70000, id + 1.0)}, {-id, std::vector<double>(3, 2.0 * id)}}};
    return ctx.all_reduce(ReduceOp::max, n);
  });
  for (const Nested& n : s.local_results(nested)) {
    EXPECT(n[0].first == R - 1 && n[1].first == 0 && n[0].second.size() == 70000, "array/pair nest");
    EXPECT(n[0].second[69999] == double(R) && n[1].second[2] == 2.0 * (R - 1), "array/pair nest vectors");
  }

  // std::span leaves are reduced in place in every replica's own buffer (small and large).
  auto spans = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    std::vector<double> small(5, id + 1.0), big(100000, 0.25 * id);
    auto r = ctx.all_reduce(ReduceOp::sum, std::tuple{std::span<double>(small), std::span<double>(big)});
    const int aliased = std::get<0>(*r).data() == small.data() && std::get<1>(r.get()).data() == big.data();
    return std::tuple{aliased, small, big};
  });
  for (int r = 0; r < R; ++r) {
    EXPECT(std::get<0>(spans)[std::size_t(r)], "span result aliases the replica's buffer");
    EXPECT(std::get<1>(spans)[std::size_t(r)][4] == R * (R + 1) / 2.0, "span in place (small)");
    EXPECT(std::get<2>(spans)[std::size_t(r)][99999] == 0.25 * R * (R - 1) / 2, "span in place (big)");
  }

  // reduce with axis0: ragged batches (replica r holds r + 1 elements); mean divides by the total count.
  auto [batches] = s.run([](auto& ctx) {  // a returned pair would be lifted: wrap it in a tuple
    const int id = ctx.replica_id_in_sync_group();
    std::vector<float> v(std::size_t(id + 1));
    for (int i = 0; i <= id; ++i) v[std::size_t(i)] = wv(id, i);
    return std::make_tuple(std::pair{v, std::array<int, 2>{id, 10 * id}});  // (std::tuple{pair} is a 2-tuple)
  });
  float want_sum = 0, want_max = 0;
  int count = 0;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i <= r; ++i, ++count) want_sum += wv(r, i), want_max = std::max(want_max, wv(r, i));
  const std::pair<float, int> a0 = s.reduce(ReduceOp::sum, batches, mirror::axis0);
  EXPECT(a0.first == want_sum && a0.second == 11 * R * (R - 1) / 2, "axis0 sum");
  EXPECT(s.reduce(ReduceOp::mean, batches, mirror::axis0).first == want_sum / float(count), "axis0 mean (ragged)");
  EXPECT(s.reduce(ReduceOp::max, batches, mirror::axis0).first == want_max, "axis0 max");

  // run arguments: PerReplica -> component i, Mirrored -> local copy, anything else shared.
  const mirror::Mirrored<std::vector<int>> table = s.broadcast(std::vector<int>{3, 1, 4});
  const std::string shared = "shared";
  auto args = s.run([](const auto& batch, const std::vector<int>& t, const std::string& str) {  // no ctx
    return int(batch.first.size()) * 100 + t[2] * 10 + int(str.size());
  }, batches, table, shared);
  for (int r = 0; r < R; ++r) EXPECT(args[std::size_t(r)] == (r + 1) * 100 + 46, "run argument passing");

  // broadcast (resizable leaves take the source's size) and merge_call (once, args gathered in order).
  std::atomic<int> merges{0};
  auto [bc, merged] = s.run([&merges](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group(), from = ctx.num_replicas_in_sync() - 1;
    auto b = ctx.broadcast(std::pair{std::vector<int>(std::size_t(id + 1), id), id * 1.5}, from);
    auto m = ctx.merge_call([&merges](auto& strategy, auto xs) {
      ++merges;
      return std::pair{std::vector<float>(xs.begin(), xs.end()), strategy.reduce(ReduceOp::sum, xs)};
    }, float(id + 1));
    return std::tuple{b, m};
  });
  EXPECT(merges == 1, "merge_call fn runs once");
  for (int r = 0; r < R; ++r) {
    EXPECT(bc[std::size_t(r)].first == std::vector<int>(std::size_t(R), R - 1) && bc[std::size_t(r)].second == (R - 1) * 1.5, "broadcast");
    EXPECT(merged[std::size_t(r)].second == R * (R + 1) / 2.0f && merged[std::size_t(r)].first.size() == std::size_t(R), "merge_call result");
    for (int q = 0; q < R; ++q) EXPECT(merged[std::size_t(r)].first[std::size_t(q)] == q + 1.0f, "merge_call gathers in replica order");
  }

  // Errors. Each is raised out of run (or reduce); afterwards the strategy still works.
  bool caught = false;
  try {
    s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, std::vector<float>(std::size_t(ctx.replica_id_in_sync_group()) + 1)); });
  } catch (const mirror::shape_error&) { caught = true; }
  EXPECT(caught, "shape_error from all_reduce of mismatched sizes");
  caught = false;
  auto ragged = s.run([](auto& ctx) { return std::vector<int>(std::size_t(ctx.replica_id_in_sync_group()) + 1); });
  try { (void)s.reduce(ReduceOp::sum, ragged); } catch (const mirror::shape_error&) { caught = true; }
  EXPECT(caught, "shape_error from reduce of mismatched sizes");
  caught = false;
  const int bad = R > 2 ? 2 : 0;
  try {
    s.run([bad](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == bad) throw std::logic_error("boom");
      ctx.all_reduce(ReduceOp::sum, 1.0f);
    });
  } catch (const mirror::replica_error& e) {
    EXPECT(e.replica() == bad, "replica_error names the replica");
    try { std::rethrow_if_nested(e); } catch (const std::logic_error& inner) { caught = std::string(inner.what()) == "boom"; }
  }
  EXPECT(caught, "replica_error with the original as nested exception");
  caught = false;
  try {
    s.run([](auto& ctx) { if (ctx.replica_id_in_sync_group() != 1) ctx.all_reduce(ReduceOp::sum, 1.0f); });
  } catch (const mirror::timeout_error& e) { caught = e.missing() == std::vector<int>{1}; }
  EXPECT(caught, "timeout_error naming the replica that returned early");
  try { s.run([](int) {}, ids); } catch (const mirror::error&) { EXPECT(false, "a valid run after errors threw"); }
  auto again = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, std::vector<int>{1, ctx.replica_id_in_sync_group()}); });
  EXPECT(again.primary() == (std::vector<int>{R, R * (R - 1) / 2}), "strategy usable after errors");
  return 0;
}

}  // namespace

int main() {
  using mirror::devices::Threads;
  mirror::Strategy<Threads> by_default{Threads{.replicas = 4}};
  mirror::Strategy<Threads, mirror::ops::ReductionToOneDevice> to_one{Threads{.replicas = 3}, {.reduce_to = 1}};
  mirror::Strategy<Threads, mirror::ops::HierarchicalCopy> hierarchical{Threads{.replicas = 5}, {.num_packs = 2}};
  mirror::Strategy<Threads, mirror::ops::HierarchicalCopy> hierarchical4{Threads{.replicas = 4}};
  if (check("default_ops_t<Threads>", by_default) || check("ReductionToOneDevice", to_one) ||
      check("HierarchicalCopy", hierarchical) || check("HierarchicalCopy", hierarchical4)) {
    return 1;
  }
  std::printf("contract: %d checks passed (default ops, ReductionToOneDevice, HierarchicalCopy)\n", checks);
  return 0;
}
