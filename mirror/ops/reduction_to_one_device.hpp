// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::ReductionToOneDevice`: reduce on one replica's device, copy the result back.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <mirror/backend/collective.hpp>
#include <mirror/backend/generic_collectives.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/reduce_op.hpp>
#include <span>
#include <stdexcept>

namespace mirror::ops {

/// TF's `ReductionToOneDevice`: every replica's leaf is reduced onto the device of replica
/// `reduce_to` (an accumulator there), divided for `mean`, and copied back to every replica.
///
/// Works on every device: it uses only the device's copy and combine primitives. All replicas
/// work in parallel: replica r handles the r-th slice of the (packed) range, still reducing on
/// `reduce_to`'s memory. Replicas are combined in the fixed order 0, 1, ..., N-1, so results are
/// bitwise reproducible and equal to a serial loop's.
///
/// On a device that has the optional `fold_into_all` primitive and can use it for the replicas'
/// buffers (`devices::Cuda` when every replica's memory is reachable from every replica's GPU:
/// logical replicas sharing one GPU, or GPUs with peer access), each replica's slice is folded
/// in the same order and written back to every replica in one kernel: 2·N·S bytes of device
/// memory traffic in all instead of (5·N − 1)·S, and the same bits.
///
/// **Requires**: `0 <= reduce_to < num_replicas_in_sync()`, else `Strategy`'s constructor throws
/// `std::invalid_argument`.
/// **Communication** (S bytes per replica, N replicas): each element crosses to `reduce_to` once
/// from every replica and back once to every replica: 2·(N-1)·S bytes over the device links.
struct ReductionToOneDevice {
  int reduce_to = 0;  ///< replica whose device holds the accumulator

  friend bool operator==(const ReductionToOneDevice&, const ReductionToOneDevice&) = default;

  /// Called by `Strategy`'s constructor: `std::invalid_argument` when `reduce_to` is not a replica.
  template <class Rt>
  void validate(const Rt& rt) const {
    if (reduce_to < 0 || reduce_to >= rt.num_replicas()) {
      const int n = static_cast<int>(rt.num_replicas());
      throw std::invalid_argument(detail::format("mirror::ops::ReductionToOneDevice{.reduce_to = %d}: the strategy has "
                                                 "%d replicas; reduce_to must be in 0..%d",
                                                 reduce_to, n, n - 1)
                                      .c_str());
    }
  }

  /// The `cross_device_ops` interface (mirror/concepts/cross_device_ops.hpp), called by every
  /// replica: reduces the leaves `s` of every replica in place.
  template <class Rt, class E>
  void all_reduce(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& s) const {
    using pointer = typename Rt::template pointer<E>;
    Rt& rt = c.runtime();
    const int self = c.self(), n = c.num_replicas();
    struct post {
      const pointer* leaves;
      pointer accumulator;
    };
    pointer mine{};
    if (self == reduce_to) mine = rt.template scratch<E>(self, s.total);
    const auto all = c.exchange(post{s.leaves.data(), mine});
    if (n == 1) return;
    const pointer acc = all[static_cast<std::size_t>(reduce_to)].accumulator;
    // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
    const auto range = backend::chunk_of<E>(0, s.total, self, n);
    const std::size_t a = range.first, b = range.second;
    // On host memory, go block by block through one reused block of this replica's part of
    // the accumulator: it stays in L1 while the leaves stream past (one pass over memory
    // instead of four; the same operations per element, so the same bits).
    constexpr std::size_t block = Rt::host_addressable ? std::max<std::size_t>(1, 8192 / sizeof(E)) : ~std::size_t{0};
    backend::for_each_piece(s.sizes, a, b, [&](std::size_t k, std::size_t off, std::size_t len, std::size_t v) {
      // A device with a fused fold (the CUDA backend, where every replica's memory is reachable
      // from this replica's GPU) reduces the piece and writes it back in one pass.
      if constexpr (requires { rt.fold_into_all(self, op, static_cast<const pointer*>(nullptr), n, len); }) {
        if (n <= Rt::max_fold_parts) {
          pointer parts[Rt::max_fold_parts];
          for (int r = 0; r < n; ++r) parts[r] = all[static_cast<std::size_t>(r)].leaves[k] + off;
          if (rt.fold_into_all(self, op, parts, n, len)) return;
        }
      }
      for (std::size_t i = 0; i < len;) {
        const std::size_t m = std::min(block, len - i);
        const pointer dst = Rt::host_addressable ? acc + a : acc + (v + i);
        rt.copy(self, dst, all[0].leaves[k] + (off + i), m);
        for (int r = 1; r < n; ++r) rt.combine(self, op, dst, all[static_cast<std::size_t>(r)].leaves[k] + (off + i), m);
        if (op == ReduceOp::mean) rt.divide(self, dst, m, static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) rt.copy(self, all[static_cast<std::size_t>(r)].leaves[k] + (off + i), dst, m);
        i += m;
      }
    });
    c.barrier();  // nobody returns (and reuses its buffer) before every slice is written back
  }

  /// The `reduce_scatter` of the `cross_device_ops` interface: each replica folds its own cut of
  /// every replica's leaves in replica order, on its own device (there is no single result to
  /// hold on `reduce_to`), so each element has the bits `all_reduce` gives it. Reads N·S/N and
  /// writes S/N bytes per replica.
  template <class Rt, class E>
  void reduce_scatter(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                      const backend::segment_list<Rt, E>& out) const {
    backend::generic_reduce_scatter(c, op, in, out, backend::serial_fold{});
  }

  /// The `all_gather` of the `cross_device_ops` interface: each replica copies every replica's
  /// leaves into its output, in replica order.
  template <class Rt, class E>
  void all_gather(backend::collective<Rt>& c, const backend::const_segment_list<Rt, E>& in,
                  std::span<const std::size_t> counts, const backend::segment_list<Rt, E>& out) const {
    backend::generic_all_gather(c, in, counts, out);
  }
};

}  // namespace mirror::ops
