// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::ChunkOwnerAllReduce`: the default all-reduce of `devices::Threads`.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <mirror/backends/threads/threads_device.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/detail/element_kernels.hpp>
#include <mirror/backend/generic_collectives.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// All-reduce for replicas that share host memory. Each replica owns 1/N of the (packed) range:
/// it reads that slice from every replica's buffer, combines it in cache, and writes the result
/// into every buffer — each byte is read once and written once per replica, the minimum memory
/// traffic (2·N·S bytes for S bytes per replica); a sum of three or more replicas reads up to
/// eight of them side by side (detail::sum_many), a sum of two is added in registers and stored
/// straight into both buffers (detail::sum_pair_in_place). Messages of at most one cache line
/// take a latency path instead: the data rides in the exchange itself, so the whole collective
/// is one barrier.
///
/// Replicas are combined in the order 0, 1, ..., N-1 (bitwise reproducible, equal to a serial
/// loop). **Requires**: a host-addressable device (`devices::Threads`).
struct ChunkOwnerAllReduce {
  /// Messages up to this many bytes take the one-barrier latency path.
  static constexpr std::size_t latency_bytes = 64;
  /// Messages up to this many bytes (a float or double scalar, two floats) travel in the same
  /// cache line as the exchange's arrival number and agreement check: one line per replica.
  static constexpr std::size_t scalar_bytes = 8;
  /// Bytes of each replica's buffer combined per block: 8 KiB stays in L1 while it is written
  /// out N times.
  static constexpr std::size_t block_bytes = 8192;
  /// With this many replicas or more, blocks of wide_block_bytes instead: N x 32 KiB (512 KiB at 16
  /// replicas) still fits a 1 MiB L2, so the write-back hits there; and each of the 8 sources read
  /// side by side runs 4x longer before the next block's, which streams from DRAM faster. Below 8
  /// replicas the wider block gains nothing (2 replicas lose), so they keep 8 KiB; above 48 KiB the
  /// write-back leaves L2. (Chosen on a standalone copy of the loop; the figures are in
  /// bench/results/comment_history.md, mirror's own in docs/performance.md\#all_reduce.) The block
  /// is on the stack: 32 KiB of every replica's, the caller's thread's included.
  static constexpr int wide_block_replicas = 8;
  static constexpr std::size_t wide_block_bytes = 32768;  ///< the wide block (see wide_block_replicas)
  /// From this many replicas up to wide_block_replicas, blocks of narrow_block_bytes: the
  /// all-reduce streams N blocks through L1 beside the accumulator, and N + 1 blocks of 8 KiB no
  /// longer fit a 32 KiB L1d: the accumulator would leave it before its N copies out (measured
  /// at 4 replicas: docs/performance.md\#against-a-hand-written-blocked-loop).
  static constexpr int narrow_block_replicas = 4;
  static constexpr std::size_t narrow_block_bytes = 4096;  ///< the narrow block (see narrow_block_replicas)

  friend bool operator==(const ChunkOwnerAllReduce&, const ChunkOwnerAllReduce&) = default;

  /// The `cross_device_ops` interface (mirror/concepts/cross_device_ops.hpp), called by every
  /// replica: reduces the leaves `s` of every replica in place.
  template <class Rt, class E>
  void all_reduce(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& s) const {
    static_assert(Rt::host_addressable,
                  "mirror::ops::ChunkOwnerAllReduce needs a device whose replicas share host memory "
                  "(devices::Threads); on other devices use ops::ReductionToOneDevice or ops::HierarchicalCopy");
    static_assert(std::is_same_v<typename Rt::template pointer<E>, E*>, "leaves are read through plain pointers");
    // One copy of the algorithm for every element type: it moves bytes, and calls the type's
    // arithmetic through element_kernels (per type, only combine_into and divide_all are
    // compiled; docs/design.md#compile-time).
    const untyped_leaves b{s.leaves.data(), s.sizes, s.total, &detail::element_kernels_of<E>::value};
    if (s.total * sizeof(E) <= scalar_bytes) {
      small<scalar_bytes>(c, op, b);
    } else if (s.total * sizeof(E) <= latency_bytes) {
      small<latency_bytes>(c, op, b);
    } else {
      large(c, op, b);
    }
  }

  /// The `reduce_scatter` of the `cross_device_ops` interface: each replica reads its own cut of
  /// every replica's leaves, folds it in replica order (the bits of `all_reduce`) and writes it
  /// once: the traffic of `all_reduce`'s first half, (N+1)·S bytes in all for S bytes per
  /// replica. A sum (or mean) of two replicas is added in registers straight into the output
  /// (detail::sum_pair_into); of more, block by block in L1 through detail::sum_many, as
  /// `all_reduce` folds them; the other ops through the device primitives
  /// (backend::generic_reduce_scatter).
  template <class Rt, class E>
  void reduce_scatter(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                      const backend::segment_list<Rt, E>& out) const {
    static_assert(Rt::host_addressable,
                  "mirror::ops::ChunkOwnerAllReduce needs a device whose replicas share host memory "
                  "(devices::Threads); on other devices use ops::ReductionToOneDevice or ops::HierarchicalCopy");
    if constexpr (std::is_same_v<typename Rt::template pointer<E>, E*> && detail::has_sum_many<E>) {
      if ((op == ReduceOp::sum || op == ReduceOp::mean) && c.num_replicas() > 1) {
        scatter_sum(c, op, in, out);
        return;
      }
    }
    backend::generic_reduce_scatter(c, op, in, out, backend::serial_fold{});
  }

  /// The `all_gather` of the `cross_device_ops` interface: each replica copies every replica's
  /// leaves into its output with memcpy, in replica order (2·N·S bytes per replica: the copy bound).
  template <class Rt, class E>
  void all_gather(backend::collective<Rt>& c, const backend::const_segment_list<Rt, E>& in,
                  std::span<const std::size_t> counts, const backend::segment_list<Rt, E>& out) const {
    static_assert(Rt::host_addressable,
                  "mirror::ops::ChunkOwnerAllReduce needs a device whose replicas share host memory "
                  "(devices::Threads); on other devices use ops::ReductionToOneDevice or ops::HierarchicalCopy");
    backend::generic_all_gather(c, in, counts, out);
  }

 private:
  // reduce_scatter's sum and mean (the reductions of training), N > 1. Folded in the order and
  // with the kernels of large(), so a cut has the same bits as all_reduce's: two replicas a + b
  // straight into the output, more into an L1 block with up to combine_pass sources side by
  // side. generic_reduce_scatter reads one replica's block at a time, which is slower at 2 and
  // at 8 replicas (bench/gather_scatter_bench.cpp measures both).
  template <class Rt, class E>
  static void scatter_sum(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                          const backend::segment_list<Rt, E>& out) {
    struct post {
      E* const* leaves;
    };
    const auto all = c.exchange(post{in.leaves.data()});
    const int n = c.num_replicas();
    constexpr std::size_t w = 16 / sizeof(E);  // elements per vector group
    const std::size_t block = (n >= wide_block_replicas ? wide_block_bytes : block_bytes) / sizeof(E);
    alignas(64) E acc[wide_block_bytes / sizeof(E)];
    for (std::size_t k = 0; k < in.sizes.size(); ++k) {
      // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
      const auto cut = backend::cut_of(in.sizes[k], n, c.self());
      const std::size_t first = cut.first, count = cut.second;
      const auto at = [&](int r, std::size_t i) -> const E* {
        return all[static_cast<std::size_t>(r)].leaves[k] + first + i;
      };
      E* const to = out.leaves[k];
      for (std::size_t i = 0; i < count; i += block) {
        const std::size_t m = std::min(block, count - i);
        if (n == 2) {
          detail::sum_pair_into(to + i, at(0, i), at(1, i), m);
          if (op == ReduceOp::mean) detail::divide_all(to + i, m, 2);
          continue;
        }
        copy_block(acc, at(0, i), m * sizeof(E));
        if (m % w == 0) {
          for (int r = 1; r < n;) {
            const void* from[detail::combine_pass];
            std::size_t sources = 0;
            for (; r < n && sources < detail::combine_pass; ++r) from[sources++] = at(r, i);
            detail::sum_many<E>(acc, from, sources, m);
          }
        } else {
          for (int r = 1; r < n; ++r) detail::combine_into(op, acc, at(r, i), m);
        }
        if (op == ReduceOp::mean) detail::divide_all(acc, m, static_cast<std::size_t>(n));
        copy_block(to + i, acc, m * sizeof(E));
      }
    }
    // Nobody returns (and reuses its buffers) before every cut is read; the exchange made the
    // agreement check.
    c.barrier();
  }

  // A block into or out of the accumulator. Whole blocks (all but a leaf's last) copy with a
  // constant size, which the compiler expands inline into one string move, as in a hand-written
  // loop over fixed blocks; the library's memcpy of a runtime size is slower for these
  // cache-resident blocks (docs/performance.md#against-a-hand-written-blocked-loop).
  static void copy_block(void* to, const void* from, std::size_t bytes) noexcept {
    if (bytes == narrow_block_bytes) {
      std::memcpy(to, from, narrow_block_bytes);
    } else if (bytes == block_bytes) {
      std::memcpy(to, from, block_bytes);
    } else {
      std::memcpy(to, from, bytes);
    }
  }

  // One replica's leaves without their element type.
  struct untyped_leaves {
    const void* leaves;  // E* const*, read through kernels->leaf
    std::span<const std::size_t> sizes;  // elements per leaf
    std::size_t total;                   // elements
    const detail::element_kernels* kernels;
  };
  template <std::size_t Bytes, class Rt>
  static void small(backend::collective<Rt>& c, ReduceOp op, const untyped_leaves& s);
  // small()'s parts that do not depend on the payload's size: one copy for both sizes (not
  // inlined, or GCC copies them into each; docs/design.md#compile-time).
  static void pack(const untyped_leaves& s, unsigned char* to) noexcept;
  static void combine_and_unpack(ReduceOp op, const untyped_leaves& s, unsigned char* acc,
                                 const unsigned char* first, std::size_t stride, std::size_t n) noexcept;
  template <class Rt>
  static void large(backend::collective<Rt>& c, ReduceOp op, const untyped_leaves& s);
};

// Out of the class, so that they are not inline: a separately compiled program then takes
// them from libmirror_threads (mirror/detail/separate_compilation.hpp).
template <std::size_t Bytes, class Rt>
void ChunkOwnerAllReduce::small(backend::collective<Rt>& c, ReduceOp op, const untyped_leaves& s) {
  // Aligned for any element type; at 8 bytes (float or double scalars, two floats) no more than
  // 8, so that the payload stays on the line of the slot's arrival number and the check.
  struct alignas(Bytes <= 8 ? 8 : 16) line {
    unsigned char data[Bytes];
  };
  line mine{};
  pack(s, mine.data);
  const auto all = c.exchange(mine);
  if (all.size() == 1) return;
  line acc = all[0];  // a copy of known size, inlined (a copy of s.total elements would be a call)
  combine_and_unpack(op, s, acc.data, all[0].data, all.stride(), all.size());
}

#if MIRROR_DETAIL_HEADER_DEFINITIONS
[[gnu::noinline]] MIRROR_DETAIL_INLINE void ChunkOwnerAllReduce::pack(const untyped_leaves& s,
                                                                    unsigned char* to) noexcept {
  const std::size_t size = s.kernels->size();
  // (An empty leaf may have no address at all: memcpy must not see it.)
  for (std::size_t k = 0; k < s.sizes.size(); ++k) {
    if (s.sizes[k] == 0) continue;
    std::memcpy(to, s.kernels->leaf(s.leaves, k), s.sizes[k] * size);
    to += s.sizes[k] * size;
  }
}

// acc holds replica 0's payload; the others' follow `first` at `stride`.
[[gnu::noinline]] MIRROR_DETAIL_INLINE void ChunkOwnerAllReduce::combine_and_unpack(
    ReduceOp op, const untyped_leaves& s, unsigned char* acc, const unsigned char* first, std::size_t stride,
    std::size_t n) noexcept {
  const std::size_t size = s.kernels->size();
  for (std::size_t r = 1; r < n; ++r) s.kernels->combine(op, acc, first + r * stride, s.total);
  if (op == ReduceOp::mean) s.kernels->divide(acc, s.total, n);
  const unsigned char* from = acc;
  for (std::size_t k = 0; k < s.sizes.size(); ++k) {
    if (s.sizes[k] == 0) continue;
    std::memcpy(s.kernels->leaf(s.leaves, k), from, s.sizes[k] * size);
    from += s.sizes[k] * size;
  }
}
#endif

template <class Rt>
void ChunkOwnerAllReduce::large(backend::collective<Rt>& c, ReduceOp op, const untyped_leaves& s) {
  struct post {
    const void* leaves;
  };
  const auto all = c.exchange(post{s.leaves});
  const int n = c.num_replicas();
  if (n == 1) return;
  const detail::element_kernels& e = *s.kernels;
  const std::size_t block =  // elements
      std::max<std::size_t>(1, (n >= wide_block_replicas     ? wide_block_bytes
                                : n >= narrow_block_replicas ? narrow_block_bytes
                                                             : block_bytes) /
                                   e.size());
  alignas(64) unsigned char acc[wide_block_bytes];
  static_assert(narrow_block_bytes >= 16 && block_bytes >= 16 && block_bytes <= wide_block_bytes,
                "a block holds at least one element of every type, and either block fits acc");
  const bool pair = n == 2 && op == ReduceOp::sum && e.sum_pair != nullptr;
  const auto [a, b] = backend::chunk_of(0, s.total, c.self(), n, e.size());
  backend::for_each_piece(s.sizes, a, b, [&](std::size_t k, std::size_t off, std::size_t len, std::size_t) {
    for (std::size_t i = off; i < off + len; i += block) {
      const std::size_t m = std::min(block, off + len - i);
      const auto at = [&](int r) { return e.leaf(all[static_cast<std::size_t>(r)].leaves, k) + i * e.size(); };
      // A sum of two replicas in registers, stored straight into both buffers
      // (detail::sum_pair_in_place): no accumulator to fill and copy out.
      if (pair && m * e.size() % 16 == 0) {
        e.sum_pair(at(0), at(1), m);
        continue;
      }
      copy_block(acc, at(0), m * e.size());
      // A sum of three or more replicas reads the others' blocks side by side, up to
      // combine_pass at a time (detail::sum_many says why); two replicas, the other ops and a
      // leaf's last block when it is not whole 16-byte groups, one replica at a time.
      if (n > 2 && e.sum != nullptr && (op == ReduceOp::sum || op == ReduceOp::mean) && m * e.size() % 16 == 0) {
        for (int r = 1; r < n;) {
          const void* from[detail::combine_pass];
          std::size_t count = 0;
          for (; r < n && count < detail::combine_pass; ++r) from[count++] = at(r);
          e.sum(acc, from, count, m);
        }
      } else {
        for (int r = 1; r < n; ++r) e.combine(op, acc, at(r), m);
      }
      if (op == ReduceOp::mean) e.divide(acc, m, static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) copy_block(at(r), acc, m * e.size());
    }
  });
  // Nobody returns (and reuses its buffer) before every slice is written back.
  c.barrier();
}

static_assert(cross_device_ops<ChunkOwnerAllReduce, devices::Threads>);

// Instantiated once, in libmirror_threads, for a separately compiled program (separate_compilation.hpp).
#define MIRROR_DETAIL_CHUNK_OWNER_INSTANCES(KIND)                                                \
  KIND void ChunkOwnerAllReduce::small<ChunkOwnerAllReduce::scalar_bytes, devices::Threads::runtime>( \
      backend::collective<devices::Threads::runtime>&, ReduceOp, const untyped_leaves&);          \
  KIND void ChunkOwnerAllReduce::small<ChunkOwnerAllReduce::latency_bytes, devices::Threads::runtime>( \
      backend::collective<devices::Threads::runtime>&, ReduceOp, const untyped_leaves&);          \
  KIND void ChunkOwnerAllReduce::large<devices::Threads::runtime>(                               \
      backend::collective<devices::Threads::runtime>&, ReduceOp, const untyped_leaves&);
#if MIRROR_DETAIL_EXTERN_TEMPLATES
MIRROR_DETAIL_CHUNK_OWNER_INSTANCES(extern template)
#endif

}  // namespace mirror::ops

namespace mirror {
/// `devices::Threads` reduces with the chunk-owner all-reduce by default.
template <>
struct default_ops<devices::Threads> {
  using type = ops::ChunkOwnerAllReduce;  ///< the ops policy
};
}  // namespace mirror
