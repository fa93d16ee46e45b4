// SPDX-License-Identifier: Apache-2.0
#pragma once
// Nest-level cross-worker collectives on top of worker_group (reduce a nest's leaves, broadcast
// a nest whose resizable leaves take the root's sizes, gather a nest's leaves in worker order),
// and the compile-time test for a runtime that spans processes. Only multi-worker strategies
// instantiate these.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>
#include <type_traits>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/host_reduce.hpp>
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/detail/worker_group.hpp>
#include <mirror/error.hpp>
#include <mirror/leaf_traits.hpp>

namespace mirror::detail {

/// True for a device runtime whose replicas span several processes (devices::Cluster).
template <class Rt>
concept spans_workers = requires(Rt& rt) {
  { rt.workers() } -> std::same_as<worker_group*>;
};

/// The op the cross-worker step applies: `mean` sums, and the caller divides once by W*R
/// (staged integer division would be wrong: [0,1 | 1,2] has mean 1, staged 0).
constexpr ReduceOp cross_op(ReduceOp op) noexcept { return op == ReduceOp::mean ? ReduceOp::sum : op; }

/// Reduces every leaf of `nest` across workers with cross_op(op); for mean, then divides by
/// `count` (the number of global replicas that contributed) unless `count` is 0 (the caller
/// divides). The group is given `op` itself, so that a `mean` and a `sum` are different calls.
template <class T>
void all_reduce_nest(worker_group& g, T& nest, ReduceOp op, std::size_t count, const char* what) {
  static_assert(!has_device_leaf<T>(),
                "mirror: a host-side cross-worker reduction (Strategy::reduce of host values, axis0, variables) got "
                "device-resident leaves (GPU memory), which never go to MPI; reduce them with ctx.all_reduce "
                "inside fn (the ops policy: NCCL on devices::Cluster<devices::Cuda>)");
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        using E = leaf_element_t<L>;
        const auto e = leaf_traits<L>::elements(l);
        g.all_reduce(e.data(), e.size(), element_kind_of<E>(), op, what);
        if (op == ReduceOp::mean && count != 0) divide_all(e.data(), e.size(), count);
      },
      nest);
}

/// Gives every worker worker `root`'s `nest`: resizable leaves (std::vector) take the root's
/// sizes; a fixed-size leaf whose size differs is a shape_error on every worker.
template <class T>
void broadcast_nest(worker_group& g, T& nest, int root, const char* what) {
  static_assert(!has_device_leaf<T>(),
                "mirror: a cross-worker broadcast (ReplicaContext::broadcast, Strategy::broadcast, make_variable) of "
                "device-resident leaves (GPU memory) is not supported: they would go to MPI, which is not CUDA-aware "
                "here; broadcast host leaves (std::vector) and upload them, or all_reduce on the devices");
  constexpr std::size_t K = leaf_count<T>();
  std::array<std::uint64_t, K + 1> sizes{};
  std::size_t k = 0;
  for_each_leaf([&](auto& l) { sizes[k++] = elements_of(l).size(); },
                nest);
  const std::array<std::uint64_t, K + 1> mine = sizes;
  g.broadcast(sizes.data(), sizeof(std::uint64_t) * K, root, what);
  // Resize, and find a fixed-size leaf that cannot take the root's size; every worker learns
  // whether any worker found one, so all throw together (or none does).
  std::int64_t bad = -1;
  k = 0;
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        if (mine[k] != sizes[k]) {
          if constexpr (leaf_traits<L>::resizable) {
            leaf_traits<L>::resize(l, static_cast<std::size_t>(sizes[k]));
          } else if (bad < 0) {
            bad = static_cast<std::int64_t>(k);
          }
        }
        ++k;
      },
      nest);
  std::int64_t any_bad = bad;
  g.all_reduce(&any_bad, 1, element_kind_of<std::int64_t>(), ReduceOp::max, what);
  if (any_bad >= 0) {
    const auto leaf = static_cast<std::size_t>(any_bad);
    throw shape_error(format("%s: leaf %zu has %llu elements on worker %d (the source) but a fixed size that "
                             "differs on some worker (here %llu); every worker must pass leaves of the same size",
                             what, leaf, static_cast<unsigned long long>(sizes[leaf]), root,
                             static_cast<unsigned long long>(mine[leaf])));
  }
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        const auto e = leaf_traits<L>::elements(l);
        g.broadcast(e.data(), e.size_bytes(), root, what);
      },
      nest);
}

/// ReplicaContext::all_gather on a multi-worker strategy: this worker's per-replica leaf counts
/// (`local[l*K + k]`, local replica l, R*K of them) become the global ones on every worker
/// (`global[g*K + k]`, g = w*R + l, W*R*K of them): worker w's block is contiguous in global
/// replica order, so one all-gather of R*K words per worker lays them out. Called by one thread
/// per worker (local replica 0); a different R*K on some worker is a shape_error on every worker.
/// `block`, `block_bytes`: the all-gather's own block, offered to travel along
/// (worker_group::all_gather_counts).
inline void all_gather_counts_across_workers(worker_group& g, std::span<const std::size_t> local,
                                             std::span<std::size_t> global, const char* what,
                                             const void* block = nullptr,
                                             std::size_t block_bytes = worker_group::no_block) {
  g.all_gather_counts(local.data(), local.size(), global.data(), what, block, block_bytes);
}

/// Strategy::gather on a multi-worker strategy. `nest` holds this worker's part, its local
/// replicas' components concatenated along the first dimension in local replica order; on
/// return every leaf holds the concatenation over the workers in worker order (global replica
/// order), on every worker. Leaves must be resizable (std::vector, matrix); a matrix keeps the
/// column count of the workers that have rows, and those must agree (shape_error on every
/// worker, naming their replicas, otherwise). `local_problem`, when not empty, is why this
/// worker's own components cannot be concatenated (their widths differ): every worker then
/// throws a shape_error, this one with that text. Collective: one all-gather of the leaf sizes,
/// then one per non-empty leaf.
template <class T>
void gather_nest_across_workers(worker_group& g, T& nest, const std::string& local_problem, const char* what) {
  static_assert(!has_device_leaf<T>(),
                "mirror: Strategy::gather across workers got device-resident leaves (GPU memory), which never go to "
                "MPI; gather host leaves (std::vector)");
  constexpr std::size_t K = leaf_count<T>();
  const auto W = static_cast<std::size_t>(g.num_workers());
  const int R = g.local_replicas();
  // Per leaf: its elements, its row width (a matrix's columns; 1 for anything else) and its
  // element kind; then whether this worker's components disagree. The kinds are compared before
  // any data moves: blocks of another element type would be taken for this one's bytes.
  constexpr std::size_t per_leaf = 3;
  std::array<std::size_t, per_leaf * K + 1> mine{};
  mine[per_leaf * K] = local_problem.empty() ? 0 : 1;
  std::size_t k = 0;
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        static_assert(leaf_traits<L>::resizable,
                      "mirror::Strategy::gather: across workers every leaf of the gathered value must be resizable "
                      "(std::vector, mirror::matrix)");
        mine[per_leaf * k] = leaf_traits<L>::elements(l).size();
        if constexpr (requires { l.cols; }) {
          mine[per_leaf * k + 1] = l.cols;
        } else {
          mine[per_leaf * k + 1] = 1;
        }
        mine[per_leaf * k + 2] = element_kind_of<leaf_element_t<L>>().code();
        ++k;
      },
      nest);
  constexpr std::size_t words = per_leaf * K + 1;
  std::vector<std::size_t> table(words * W);
  g.all_gather_counts(mine.data(), words, table.data(), what);
  // Worker w's replicas: w*R..(w+1)*R-1.
  const auto first_replica = [&](std::size_t w) { return w * static_cast<std::size_t>(R); };
  const auto last_replica = [&](std::size_t w) { return (w + 1) * static_cast<std::size_t>(R) - 1; };
  if (!local_problem.empty()) throw shape_error(local_problem);
  for (std::size_t p = 0; p < W; ++p) {
    if (table[p * words + per_leaf * K] != 0) {
      throw shape_error(format("%s: the components on worker %zu (replicas %zu..%zu) have rows of different widths "
                               "(that worker's shape_error names them); gathered leaves may differ in their first "
                               "dimension only",
                               what, p, first_replica(p), last_replica(p)));
    }
  }
  // Leaf k of worker p: its elements, its width, its kind.
  const auto all = [&](std::size_t p, std::size_t word) { return table[p * words + word]; };
  for (k = 0; k < K; ++k) {
    for (std::size_t p = 1; p < W; ++p) {
      if (all(p, per_leaf * k + 2) == all(0, per_leaf * k + 2)) continue;
      const element_kind theirs = element_kind::from_code(all(p, per_leaf * k + 2)),
                         first = element_kind::from_code(all(0, per_leaf * k + 2));
      throw shape_error(format("%s: leaf %zu holds %s elements on worker %zu (replicas %zu..%zu) but %s on "
                               "worker 0 (replicas 0..%zu); every worker must gather the same element types",
                               what, k, kind_name(theirs).c_str(), p, first_replica(p), last_replica(p),
                               kind_name(first).c_str(), last_replica(0)));
    }
  }
  // Workers with rows must agree on the row width: every worker reads the same table, so all
  // throw together (or none does). A worker without rows takes theirs.
  std::array<std::size_t, K> width{};
  for (k = 0; k < K; ++k) {
    std::size_t first = W;
    for (std::size_t p = 0; p < W; ++p) {
      if (all(p, per_leaf * k) == 0) continue;
      if (first == W) {
        first = p;
      } else if (all(p, per_leaf * k + 1) != all(first, per_leaf * k + 1)) {
        throw shape_error(format("%s: leaf %zu has rows of %zu elements on worker %zu (replicas %zu..%zu) but of %zu "
                                 "on worker %zu (replicas %zu..%zu); gathered leaves may differ in their first "
                                 "dimension only",
                                 what, k, all(p, per_leaf * k + 1), p, first_replica(p), last_replica(p),
                                 all(first, per_leaf * k + 1), first, first_replica(first), last_replica(first)));
      }
    }
    width[k] = first == W ? mine[per_leaf * k + 1] : all(first, per_leaf * k + 1);
  }
  k = 0;
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        using E = leaf_element_t<L>;
        std::vector<std::size_t> counts(W);
        std::size_t total = 0, at = 0;
        for (std::size_t p = 0; p < W; ++p) {
          counts[p] = all(p, per_leaf * k);
          if (p < static_cast<std::size_t>(g.worker_index())) at += counts[p];
          total += counts[p];
        }
        const std::size_t own = mine[per_leaf * k];
        leaf_traits<L>::resize(l, total);
        const auto e = leaf_traits<L>::elements(l);
        if (own != 0 && at != 0) std::memmove(e.data() + at, e.data(), own * sizeof(E));  // own block to its place
        if constexpr (requires { l.cols; }) l.cols = width[k];
        void* leaf = e.data();
        if (total != 0) g.all_gather(&leaf, 1, counts.data(), sizeof(E), what, true);
        ++k;
      },
      nest);
}

/// Throws on every worker unless `value` is equal on all of them (one small MAX all-reduce of
/// {v, -v}); `describe` builds the message from the local value and the maximum seen.
template <class Describe>
void require_equal_across_workers(worker_group& g, std::int64_t value, const char* what, Describe&& describe) {
  std::int64_t both[2] = {value, -value};
  g.all_reduce(both, 2, element_kind_of<std::int64_t>(), ReduceOp::max, what);
  if (both[0] != -both[1]) describe(both[0], -both[1]);
}

/// Strategy::reduce(op, value, axis0) on a multi-worker strategy: this worker's components
/// (`components`, its local replicas) reduced over replicas and the batch axis into `out`, then
/// across workers; a mean divides by the element count of every replica of every worker, so
/// ragged batches weigh right. Every worker calls it (two cross-worker collectives).
template <class T, class R>
void reduce_axis0_across_workers(worker_group& g, ReduceOp op, R& out, std::vector<const T*> components) {
  constexpr const char* what = "mirror::Strategy::reduce(axis0)";
  reduce_axis0_into<T>(cross_op(op), out, components);
  all_reduce_nest(g, out, op, 0, what);
  if (op != ReduceOp::mean) return;
  constexpr std::size_t K = leaf_count<R>();
  std::array<std::int64_t, K> counts{};
  for (const T* c : components) {
    std::size_t k = 0;
    for_each_leaf([&](const auto& l) { counts[k++] += static_cast<std::int64_t>(elements_of(l).size()); }, *c);
  }
  g.all_reduce(counts.data(), K, element_kind_of<std::int64_t>(), ReduceOp::sum, what);
  std::size_t k = 0;
  for_each_leaf(
      [&](auto& x) {
        using E = std::remove_cvref_t<decltype(x)>;
        const auto n = static_cast<std::size_t>(counts[k++]);
        if (n == 0) {
          if constexpr (std::is_integral_v<E>) {
            throw shape_error(format("mirror::Strategy::reduce(mean, value, axis0): no elements on any replica of "
                                     "any worker; the mean of zero %s elements is undefined (use sum, or a "
                                     "floating-point leaf, which gives NaN)",
                                     type_name<E>().c_str()));
          } else {
            x = x / E(0);
            return;
          }
        }
        x = divide(x, n);
      },
      out);
}

}  // namespace mirror::detail
