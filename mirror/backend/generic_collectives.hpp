// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::backend::generic_reduce_scatter` and `generic_all_gather`: the two collectives
/// through a device's copy, combine and divide primitives only, so that they run unchanged on
/// every device (tests/support/fake_device.hpp proves it). An ops policy calls them with the
/// order its all-reduce folds replicas in, so that a cut of reduce_scatter has the same bits as
/// the same elements of that policy's all_reduce.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <span>
#include <mirror/backend/collective.hpp>
#include <mirror/backend/cut_of.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::backend {

/// The order an all-reduce combines replicas in for some elements: replicas
/// [group0_begin, group0_end) in order, and when group 1 is not empty, replicas
/// [group1_begin, group1_end) in order apart, then group 0's result op group 1's.
struct fold_order {
  int group0_begin = 0;  ///< first replica of group 0
  int group0_end = 0;    ///< one past group 0's last replica
  int group1_begin = 0;  ///< first replica of group 1
  int group1_end = 0;    ///< one past group 1's last replica (group1_begin: no group 1)
};

/// Replicas 0, 1, ..., n-1 in order: the serial loop.
constexpr fold_order serial_order(int n) noexcept { return {0, n, 0, 0}; }

/// Calls `emit(offset_in_leaf, count, serial_order(n))` for the whole cut: for the policies whose
/// all-reduce folds every element in replica order.
struct serial_fold {
  /// The fold order of one part of a cut (the arguments: replicas, leaf, offset in the leaf,
  /// count, offset in the packed range, and the callback).
  template <class Emit>
  void operator()(int n, std::size_t, std::size_t off, std::size_t len, std::size_t, Emit&& emit) const {
    emit(off, len, serial_order(n));
  }
};

/// Replica self's part of reduce_scatter on one process (c.num_replicas() replicas in all):
/// `out.leaves[k]` (the cut's length) receives the op-reduction of cut `self` of leaf k over all
/// replicas, folded in the order `order(n, k, offset, count, virtual_offset, emit)` gives (it
/// calls `emit(offset, count, fold_order)` for consecutive parts of the cut). `out` may be this
/// replica's own cut of `in` (in place): every part is folded into scratch before it is written.
template <class Rt, class E, class Order>
void generic_reduce_scatter(collective<Rt>& c, ReduceOp op, const segment_list<Rt, E>& in,
                            const segment_list<Rt, E>& out, const Order& order) {
  using pointer = typename Rt::template pointer<E>;
  Rt& rt = c.runtime();
  const int self = c.self(), n = c.num_replicas();
  // Host memory: blocks that stay in L1 while every replica's part streams past. Elsewhere the
  // accumulators are scratch on this replica's device, two per element (the second for a group).
  constexpr bool host = Rt::host_addressable;
  constexpr std::size_t block = host ? std::max<std::size_t>(1, 8192 / sizeof(E)) : ~std::size_t{0};
  std::size_t largest = 0;
  for (std::size_t k = 0; k < in.sizes.size(); ++k) largest = std::max(largest, cut_of(in.sizes[k], n, self).second);
  // The two accumulators (the second for a fold in two groups).
  pointer acc0{}, acc1{};
  [[maybe_unused]] alignas(64) E host_acc[host ? 2 * block : 1];
  if constexpr (host) {
    acc0 = host_acc;
    acc1 = host_acc + block;
  } else if (n > 1 && largest > 0) {
    acc0 = rt.template scratch<E>(self, 2 * largest);
    acc1 = acc0 + largest;
  }
  struct post {
    const pointer* leaves;
  };
  const auto all = c.exchange(post{in.leaves.data()});
  std::size_t start = 0;  // of leaf k in the packed range
  for (std::size_t k = 0; k < in.sizes.size(); ++k) {
    const auto cut = cut_of(in.sizes[k], n, self);
    if (n == 1) {
      rt.copy(self, out.leaves[k], in.leaves[k], cut.second);  // (a no-op in place)
    } else if (cut.second > 0) {
      order(n, k, cut.first, cut.second, start + cut.first, [&](std::size_t off, std::size_t len, fold_order o) {
        for (std::size_t i = 0; i < len;) {
          const std::size_t m = std::min(block, len - i);
          const std::size_t at = off + i;
          const auto source = [&](int r) { return all[static_cast<std::size_t>(r)].leaves[k] + at; };
          rt.copy(self, acc0, source(o.group0_begin), m);
          for (int r = o.group0_begin + 1; r < o.group0_end; ++r) rt.combine(self, op, acc0, source(r), m);
          if (o.group1_begin < o.group1_end) {
            rt.copy(self, acc1, source(o.group1_begin), m);
            for (int r = o.group1_begin + 1; r < o.group1_end; ++r) rt.combine(self, op, acc1, source(r), m);
            rt.combine(self, op, acc0, acc1, m);
          }
          if (op == ReduceOp::mean) rt.divide(self, acc0, m, static_cast<std::size_t>(n));
          rt.copy(self, out.leaves[k] + (at - cut.first), acc0, m);
          i += m;
        }
      });
    }
    start += in.sizes[k];
  }
  c.barrier();  // nobody returns (and reuses its buffers) before every cut is read
}

/// Replica self's part of all_gather on one process: `out.leaves[k]` receives every replica's
/// leaf k in replica order; `counts[r * K + k]` is replica r's length of leaf k (K leaves).
template <class Rt, class E>
void generic_all_gather(collective<Rt>& c, const const_segment_list<Rt, E>& in, std::span<const std::size_t> counts,
                        const segment_list<Rt, E>& out) {
  using pointer = typename Rt::template pointer<const E>;
  Rt& rt = c.runtime();
  const int self = c.self(), n = c.num_replicas();
  const std::size_t leaves = in.leaves.size();
  struct post {
    const pointer* leaves;
  };
  const auto all = c.exchange(post{in.leaves.data()});
  for (std::size_t k = 0; k < leaves; ++k) {
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      const std::size_t count = counts[static_cast<std::size_t>(r) * leaves + k];
      if (count > 0) rt.copy(self, out.leaves[k] + at, all[static_cast<std::size_t>(r)].leaves[k], count);
      at += count;
    }
  }
  c.barrier();  // nobody returns (and reuses its buffers) before every replica has read them
}

}  // namespace mirror::backend
