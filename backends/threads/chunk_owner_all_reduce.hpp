// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::ChunkOwnerAllReduce`: the default all-reduce of `devices::Threads`.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <cstring>
#include <backends/threads/threads_device.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/detail/collective.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/segments.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// All-reduce for replicas that share host memory. Each replica owns 1/N of the (packed) range:
/// it reads that slice from every replica's buffer, combines it in cache, and writes the result
/// into every buffer — each byte is read once and written once per replica, the minimum memory
/// traffic (2·N·S bytes for S bytes per replica). Messages of at most one cache line take a
/// latency path instead: the data rides in the exchange itself, so the whole collective is one
/// barrier.
///
/// Replicas are combined in the order 0, 1, ..., N-1 (bitwise reproducible, equal to a serial
/// loop). **Requires**: a host-addressable device (`devices::Threads`).
struct ChunkOwnerAllReduce {
  /// Messages up to this many bytes take the one-barrier latency path.
  static constexpr std::size_t latency_bytes = 64;
  /// Messages up to this many bytes (a float or double scalar, two floats) travel in the same
  /// cache line as the exchange's arrival number and agreement check: one line per replica.
  static constexpr std::size_t scalar_bytes = 8;
  /// Elements combined per block; 8 KiB of floats stays in L1 while it is written out N times.
  static constexpr std::size_t block_bytes = 8192;

  friend bool operator==(const ChunkOwnerAllReduce&, const ChunkOwnerAllReduce&) = default;

  template <class Rt, class E>
  void all_reduce(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s) const {
    static_assert(Rt::host_addressable,
                  "mirror::ops::ChunkOwnerAllReduce needs a device whose replicas share host memory "
                  "(devices::Threads); on other devices use ops::ReductionToOneDevice or ops::HierarchicalCopy");
    if (s.total * sizeof(E) <= latency_bytes) {
      small(c, op, s);
    } else {
      large(c, op, s);
    }
  }

 private:
  template <class Rt, class E>
  static void small(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s);
  template <std::size_t Bytes, class Rt, class E>
  static void small_within(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s);
  template <class Rt, class E>
  static void large(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s);
};

// Out of the class, so that they are not inline: a separately compiled program then takes
// them from libmirror_threads (mirror/detail/separate_compilation.hpp).
template <class Rt, class E>
void ChunkOwnerAllReduce::small(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s) {
  if (s.total * sizeof(E) <= scalar_bytes) {
    small_within<scalar_bytes>(c, op, s);
  } else {
    small_within<latency_bytes>(c, op, s);
  }
}

template <std::size_t Bytes, class Rt, class E>
void ChunkOwnerAllReduce::small_within(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s) {
  constexpr std::size_t capacity = Bytes / sizeof(E) > 0 ? Bytes / sizeof(E) : 1;
  struct line {
    E values[capacity];
  };
  line mine{};
  std::size_t at = 0;
  for (std::size_t k = 0; k < s.leaves.size(); ++k) {
    std::copy(s.leaves[k], s.leaves[k] + s.sizes[k], mine.values + at);
    at += s.sizes[k];
  }
  const auto all = c.exchange(mine);
  const std::size_t n = all.size();
  if (n == 1) return;
  line acc = all[0];
  for (std::size_t r = 1; r < n; ++r) detail::combine_into(op, acc.values, all[r].values, s.total);
  if (op == ReduceOp::mean) detail::divide_all(acc.values, s.total, n);
  at = 0;
  for (std::size_t k = 0; k < s.leaves.size(); ++k) {
    std::copy(acc.values + at, acc.values + at + s.sizes[k], s.leaves[k]);
    at += s.sizes[k];
  }
}

template <class Rt, class E>
void ChunkOwnerAllReduce::large(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s) {
  struct post {
    E* const* leaves;
  };
  const auto all = c.exchange(post{s.leaves.data()});
  const int n = c.num_replicas();
  if (n == 1) return;
  constexpr std::size_t block = std::max<std::size_t>(1, block_bytes / sizeof(E));
  alignas(64) E acc[block];
  const auto [a, b] = detail::chunk_of<E>(0, s.total, c.self(), n);
  detail::for_each_piece(s.sizes, a, b, [&](std::size_t k, std::size_t off, std::size_t len, std::size_t) {
    for (std::size_t i = off; i < off + len; i += block) {
      const std::size_t m = std::min(block, off + len - i);
      std::memcpy(acc, all[0].leaves[k] + i, m * sizeof(E));
      for (int r = 1; r < n; ++r) detail::combine_into(op, acc, all[static_cast<std::size_t>(r)].leaves[k] + i, m);
      if (op == ReduceOp::mean) detail::divide_all(acc, m, static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) std::memcpy(all[static_cast<std::size_t>(r)].leaves[k] + i, acc, m * sizeof(E));
    }
  });
  c.barrier();  // nobody returns (and reuses its buffer) before every slice is written back
}

static_assert(cross_device_ops<ChunkOwnerAllReduce, devices::Threads>);

// Instantiated once, in libmirror_threads, for a separately compiled program (separate_compilation.hpp).
#define MIRROR_DETAIL_CHUNK_OWNER_INSTANCES(KIND, E)                                               \
  KIND void ChunkOwnerAllReduce::small<devices::Threads::runtime, E>(                              \
      detail::collective<devices::Threads::runtime>&, ReduceOp,                                    \
      const detail::segment_list<devices::Threads::runtime, E>&);                                  \
  KIND void ChunkOwnerAllReduce::large<devices::Threads::runtime, E>(                              \
      detail::collective<devices::Threads::runtime>&, ReduceOp,                                    \
      const detail::segment_list<devices::Threads::runtime, E>&);
#if MIRROR_DETAIL_EXTERN_TEMPLATES
MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_CHUNK_OWNER_INSTANCES, extern template)
#endif

}  // namespace mirror::ops

namespace mirror {
/// `devices::Threads` reduces with the chunk-owner all-reduce by default.
template <>
struct default_ops<devices::Threads> {
  using type = ops::ChunkOwnerAllReduce;
};
}  // namespace mirror
