// SPDX-License-Identifier: Apache-2.0
// libmirror_threads: the parts of mirror a program built with MIRROR_SEPARATE_COMPILATION
// takes from a library instead of compiling them in every translation unit
// (mirror/detail/separate_compilation.hpp says which and why). Header-only programs do not
// need it. This file only instantiates: every definition is in the headers, where
// MIRROR_DETAIL_BUILDING_LIBRARY makes the non-template ones ordinary (non-inline) functions.

#define MIRROR_DETAIL_BUILDING_LIBRARY 1

// Everything <mirror/mirror.hpp> brings, so that no MIRROR_DETAIL_INLINE definition is left out
// (a program in separate mode would not link). Backends' own code (CUDA, MPI) is not compiled
// here: their headers declare functions of their own libraries, and nothing here calls them.
#include <mirror/mirror.hpp>

namespace mirror::detail {
const int link_libmirror_threads_for_MIRROR_SEPARATE_COMPILATION = 1;

#define MIRROR_DETAIL_INSTANTIATE(E)                                                                      \
  template void combine_into<E>(ReduceOp, E* __restrict, const E* __restrict, std::size_t) noexcept;      \
  template void divide_all<E>(E*, std::size_t, std::size_t) noexcept;                                     \
  template std::pair<std::size_t, std::size_t> chunk_of<E>(std::size_t, std::size_t, int, int) noexcept;  \
  template void reduce_range<E>(ReduceOp, E*, const void* const*, std::size_t, std::size_t, std::size_t); \
  template void reduce_leaf<E>(ReduceOp, E*, std::size_t, const void* const*, std::size_t, parallel_ref);
MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_INSTANTIATE)
#undef MIRROR_DETAIL_INSTANTIATE
}  // namespace mirror::detail

namespace mirror::ops {
#define MIRROR_DETAIL_INSTANTIATE(E)                                                          \
  template void ChunkOwnerAllReduce::small<devices::Threads::runtime, E>(                    \
      detail::collective<devices::Threads::runtime>&, ReduceOp,                               \
      const detail::segment_list<devices::Threads::runtime, E>&);                             \
  template void ChunkOwnerAllReduce::large<devices::Threads::runtime, E>(                    \
      detail::collective<devices::Threads::runtime>&, ReduceOp,                               \
      const detail::segment_list<devices::Threads::runtime, E>&);
MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_INSTANTIATE)
#undef MIRROR_DETAIL_INSTANTIATE
}  // namespace mirror::ops
