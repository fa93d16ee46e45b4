// SPDX-License-Identifier: Apache-2.0
#pragma once
// An ops policy written against mirror's public backend API alone (<mirror/backend.hpp>), as
// docs/backend.md walks through it. Strategy<Device, example::SliceOwnerAllReduce> uses it like
// any policy mirror ships; tests/examples/custom_ops_*_test.cpp run it through the same
// conformance suites.

#include <cstddef>
#include <span>
#include <mirror/backend.hpp>

namespace example {

// [policy]
/// All-reduce by slice owners: the leaves of one element type are seen as one packed range, cut
/// into one slice per replica. Each replica folds its slice of every replica's leaves, in replica
/// order, into its own scratch memory, then copies the result into every replica's leaves. It
/// uses only the device's copy, combine, divide and scratch primitives, so it runs on every
/// device; folding in replica order gives the bits of a serial loop.
struct SliceOwnerAllReduce {
  friend bool operator==(const SliceOwnerAllReduce&, const SliceOwnerAllReduce&) = default;

  template <class Rt, class E>
  void all_reduce(mirror::backend::collective<Rt>& c, mirror::ReduceOp op,
                  const mirror::backend::segment_list<Rt, E>& s) const {
    using pointer = typename Rt::template pointer<E>;
    Rt& rt = c.runtime();
    const int self = c.self(), n = c.num_replicas();
    // Every replica posts where its leaves are. This first exchange also checks that every
    // replica makes the same call with the same shapes (a mirror::shape_error on all if not).
    struct post {
      const pointer* leaves;
    };
    const auto all = c.exchange(post{s.leaves.data()});
    if (n == 1) return;  // one replica: its leaves are the result (mean divides by 1)
    // This replica's slice of the packed range, on 64-byte boundaries so that no two replicas
    // write one cache line.
    const auto slice = mirror::backend::chunk_of<E>(0, s.total, self, n);
    const pointer acc = rt.template scratch<E>(self, slice.second - slice.first);
    mirror::backend::for_each_piece(
        s.sizes, slice.first, slice.second, [&](std::size_t k, std::size_t offset, std::size_t count, std::size_t at) {
          const pointer dst = acc + (at - slice.first);
          rt.copy(self, dst, all[0].leaves[k] + offset, count);
          for (int r = 1; r < n; ++r) rt.combine(self, op, dst, all[static_cast<std::size_t>(r)].leaves[k] + offset, count);
          if (op == mirror::ReduceOp::mean) rt.divide(self, dst, count, static_cast<std::size_t>(n));
          // Slices are disjoint, so writing this one back cannot disturb another replica's fold.
          for (int r = 0; r < n; ++r) rt.copy(self, all[static_cast<std::size_t>(r)].leaves[k] + offset, dst, count);
        });
    c.barrier();  // nobody returns, and reuses its leaves, before every slice is written back
  }

  // reduce_scatter and all_gather (for ctx.reduce_scatter, ctx.all_gather and
  // MirroredVariable's update_sharded): the generic forms, folding in replica order as
  // all_reduce does, so that a cut of reduce_scatter has all_reduce's bits.
  template <class Rt, class E>
  void reduce_scatter(mirror::backend::collective<Rt>& c, mirror::ReduceOp op,
                      const mirror::backend::segment_list<Rt, E>& in,
                      const mirror::backend::segment_list<Rt, E>& out) const {
    mirror::backend::generic_reduce_scatter(c, op, in, out, mirror::backend::serial_fold{});
  }
  template <class Rt, class E>
  void all_gather(mirror::backend::collective<Rt>& c, const mirror::backend::const_segment_list<Rt, E>& in,
                  std::span<const std::size_t> counts, const mirror::backend::segment_list<Rt, E>& out) const {
    mirror::backend::generic_all_gather(c, in, counts, out);
  }
};
// [/policy]

}  // namespace example
