// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::HierarchicalCopy`: TF's two-group tree all-reduce, with odd counts handled.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <mirror/backend/collective.hpp>
#include <mirror/backend/generic_collectives.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/reduce_op.hpp>
#include <span>
#include <stdexcept>
#include <utility>

namespace mirror::ops {

/// TF's `HierarchicalCopyAllReduce` (`aggregate_gradients_using_hierarchical_copy`, built for
/// DGX-1's two groups of four GPUs). Leaves of one element type are concatenated and split into
/// `num_packs` packs (each `total / num_packs` elements, the last takes the rest; `0` = one pack
/// per leaf). With n replicas and g = n / 2, pack i has main devices `m0 = i % n` and m1 in the
/// other group; each group is reduced on its main device, the two partial results are combined
/// on m0, copied to m1, and each group receives the result from its own main device.
///
/// TF's groups `[0, g)` and `[g, 2g)` leave the last device out when n is odd (its value is
/// never added, yet it receives the result). mirror's groups are `[0, g)` and `[g, n)`, and m1 is
/// the member of the other group at m0's position (modulo its size), which equals TF's
/// `(m0 + g) % n` whenever n is even.
///
/// All replicas work in parallel: replica r handles the r-th slice of every pack. Results are
/// bitwise reproducible (fixed order within each group, then group 0 op group 1).
///
/// **Requires**: `num_packs >= 0`, else `Strategy`'s constructor throws `std::invalid_argument`.
struct HierarchicalCopy {
  int num_packs = 1;  ///< packs the concatenated leaves are split into; 0 = one pack per leaf

  friend bool operator==(const HierarchicalCopy&, const HierarchicalCopy&) = default;

  /// Called by `Strategy`'s constructor: `std::invalid_argument` when `num_packs < 0`.
  template <class Rt>
  void validate(const Rt&) const {
    if (num_packs < 0) {
      throw std::invalid_argument(detail::format("mirror::ops::HierarchicalCopy{.num_packs = %d}: num_packs must be "
                                                 ">= 0 (0 = one pack per leaf)",
                                                 num_packs)
                                      .c_str());
    }
  }

  /// The two groups and main devices of pack `i` among `n` replicas.
  struct plan {
    int group0_begin;  ///< first replica of the group whose sum lands on main0
    int group0_end;    ///< one past its last replica
    int group1_begin;  ///< first replica of the other group
    int group1_end;    ///< one past its last replica
    int main0;         ///< reduces group 0, adds group 1's sum, and sends the total to main1
    int main1;         ///< reduces group 1; broadcasts the total within group 1
  };
  /// The plan of pack `i` among `n` replicas (see the struct comment for the rule).
  static constexpr plan plan_for(std::size_t i, int n) noexcept {
    const int g = n / 2;
    const int m0 = static_cast<int>(i % static_cast<std::size_t>(n));
    plan p{};
    if (m0 < g) {
      p = {0, g, g, n, m0, 0};
    } else {
      p = {g, n, 0, g, m0, 0};
    }
    p.main1 = p.group1_begin + (m0 - p.group0_begin) % (p.group1_end - p.group1_begin);
    return p;
  }

  /// The elements [first, second) of the concatenated leaves that form pack `i` of `packs`
  /// (TF's `_ConcatAndSplitPacker`: `total / packs` each, the last takes the rest).
  static constexpr std::pair<std::size_t, std::size_t> pack_range(std::size_t i, std::size_t packs,
                                                                  std::size_t total) noexcept {
    const std::size_t per = total / packs;
    return {i * per, i + 1 == packs ? total : (i + 1) * per};
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
    const pointer mine = n > 1 ? rt.template scratch<E>(self, s.total) : pointer{};
    const auto all = c.exchange(post{s.leaves.data(), mine});
    if (n == 1) return;
    auto leaf = [&](int r, std::size_t k, std::size_t off) {
      return all[static_cast<std::size_t>(r)].leaves[k] + off;
    };
    // On host memory, go block by block through one reused block of this replica's part of each
    // accumulator: it stays in L1 while the leaves stream past (the same operations per element,
    // so the same bits).
    constexpr std::size_t block = Rt::host_addressable ? std::max<std::size_t>(1, 8192 / sizeof(E)) : ~std::size_t{0};
    auto reduce_pack = [&](std::size_t index, std::size_t begin, std::size_t end) {
      const plan p = plan_for(index, n);
      // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
      const auto range = backend::chunk_of<E>(begin, end, self, n);
      const std::size_t a = range.first, b = range.second;
      backend::for_each_piece(s.sizes, a, b, [&](std::size_t k, std::size_t off, std::size_t len, std::size_t v) {
        for (std::size_t i = 0; i < len;) {
          const std::size_t m = std::min(block, len - i);
          const std::size_t at = Rt::host_addressable ? a : v + i;
          const pointer acc0 = all[static_cast<std::size_t>(p.main0)].accumulator + at;
          const pointer acc1 = all[static_cast<std::size_t>(p.main1)].accumulator + at;
          const std::size_t o = off + i;
          rt.copy(self, acc0, leaf(p.group0_begin, k, o), m);
          for (int r = p.group0_begin + 1; r < p.group0_end; ++r) rt.combine(self, op, acc0, leaf(r, k, o), m);
          rt.copy(self, acc1, leaf(p.group1_begin, k, o), m);
          for (int r = p.group1_begin + 1; r < p.group1_end; ++r) rt.combine(self, op, acc1, leaf(r, k, o), m);
          rt.combine(self, op, acc0, acc1, m);
          if (op == ReduceOp::mean) rt.divide(self, acc0, m, static_cast<std::size_t>(n));
          rt.copy(self, acc1, acc0, m);
          for (int j = 0; j < n; ++j) {
            const bool with_main0 = j >= p.group0_begin && j < p.group0_end;
            rt.copy(self, leaf(j, k, o), with_main0 ? acc0 : acc1, m);
          }
          i += m;
        }
      });
    };
    if (num_packs == 0) {
      std::size_t start = 0;
      for (std::size_t k = 0; k < s.sizes.size(); ++k) {
        reduce_pack(k, start, start + s.sizes[k]);
        start += s.sizes[k];
      }
    } else {
      const std::size_t packs = static_cast<std::size_t>(num_packs);
      for (std::size_t i = 0; i < packs; ++i) {
        const auto [begin, end] = pack_range(i, packs, s.total);
        if (begin < end) reduce_pack(i, begin, end);
      }
    }
    c.barrier();
  }

  /// The `reduce_scatter` of the `cross_device_ops` interface: each replica folds its own cut of
  /// every replica's leaves with the plan `all_reduce` uses for the pack each element is in
  /// (group 0 in order, group 1 in order, then group 0 op group 1), so each element has the bits
  /// `all_reduce` gives it.
  template <class Rt, class E>
  void reduce_scatter(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                      const backend::segment_list<Rt, E>& out) const {
    const std::size_t total = in.total;
    const int packs = num_packs;
    backend::generic_reduce_scatter(
        c, op, in, out,
        [total, packs](int n, std::size_t k, std::size_t off, std::size_t len, std::size_t v, auto&& emit) {
          const auto order_of = [n](std::size_t pack) {
            const plan p = plan_for(pack, n);
            return backend::fold_order{p.group0_begin, p.group0_end, p.group1_begin, p.group1_end};
          };
          if (packs == 0) {  // one pack per leaf
            emit(off, len, order_of(k));
            return;
          }
          for (std::size_t i = 0; i < static_cast<std::size_t>(packs); ++i) {
            const auto [begin, end] = pack_range(i, static_cast<std::size_t>(packs), total);
            const std::size_t a = std::max(begin, v), b = std::min(end, v + len);
            if (a < b) emit(off + (a - v), b - a, order_of(i));
          }
        });
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
