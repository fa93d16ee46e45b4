// SPDX-License-Identifier: Apache-2.0
#pragma once
// Separate compilation: mirror is header-only by default. A program that defines
// MIRROR_SEPARATE_COMPILATION (to nothing or 1, in every translation unit, e.g. with
// -DMIRROR_SEPARATE_COMPILATION from pkg-config's `mirror-separate`) and links libmirror_threads
// compiles the parts of mirror that do not depend on its own types once, in that library,
// instead of in every translation unit: the thread pool of devices::Threads, the default
// all-reduce and Strategy::reduce's per-leaf work (one copy each, for every element type), the
// arithmetic kernels for every arithmetic element type, and the builders of error messages.
// They are half of what a translation unit that uses run, reduce and all_reduce costs to
// compile at -O2 (docs/performance.md). The same technique as Boost.Asio's
// BOOST_ASIO_SEPARATE_COMPILATION and spdlog's compiled mode.
//
// Headers use three macros from here:
// * MIRROR_DETAIL_INLINE prefixes a non-template function defined below its declaration:
//   `inline` when header-only, nothing in the library (one strong definition).
// * MIRROR_DETAIL_HEADER_DEFINITIONS is 1 where such definitions are compiled: header-only
//   translation units and the library's own source; 0 in a separately compiled program.
// * MIRROR_DETAIL_EXTERN_TEMPLATES is 1 in a separately compiled program: headers then declare
//   `extern template` instantiations of their element-type templates for every type in
//   MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT, which the library instantiates. Other element types
//   (none today: the list is every type detail::is_host_element accepts) instantiate as usual.
//   Each header writes its instantiations once, as MIRROR_DETAIL_<NAME>_INSTANCES(KIND, E) with
//   KIND `extern template` there and `template` in the library's source.

#if defined(MIRROR_SEPARATE_COMPILATION) && !defined(MIRROR_DETAIL_BUILDING_LIBRARY)
#define MIRROR_DETAIL_INLINE
#define MIRROR_DETAIL_HEADER_DEFINITIONS 0
#define MIRROR_DETAIL_EXTERN_TEMPLATES 1
#elif defined(MIRROR_DETAIL_BUILDING_LIBRARY)
#define MIRROR_DETAIL_INLINE
#define MIRROR_DETAIL_HEADER_DEFINITIONS 1
#define MIRROR_DETAIL_EXTERN_TEMPLATES 0
#else
#define MIRROR_DETAIL_INLINE inline
#define MIRROR_DETAIL_HEADER_DEFINITIONS 1
#define MIRROR_DETAIL_EXTERN_TEMPLATES 0
#endif

#if MIRROR_DETAIL_EXTERN_TEMPLATES || defined(MIRROR_DETAIL_BUILDING_LIBRARY)
namespace mirror::detail {
// Defined in libmirror_threads. Every translation unit of a separately compiled program refers
// to it, so a link without the library reports this name among its undefined references, and
// the name says what to do.
extern const int link_libmirror_threads_for_MIRROR_SEPARATE_COMPILATION;
}  // namespace mirror::detail
#endif
#if MIRROR_DETAIL_EXTERN_TEMPLATES && defined(__GNUC__)
namespace mirror::detail {
[[gnu::used]] static const int* const separate_compilation_library =
    &link_libmirror_threads_for_MIRROR_SEPARATE_COMPILATION;
}  // namespace mirror::detail
#endif

/// X(KIND, E) for every element type E host collectives accept (detail::is_host_element).
#define MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(X, KIND) \
  X(KIND, float)                                     \
  X(KIND, double)                                    \
  X(KIND, long double)                               \
  X(KIND, signed char)                               \
  X(KIND, unsigned char)                             \
  X(KIND, short)                                     \
  X(KIND, unsigned short)                            \
  X(KIND, int)                                       \
  X(KIND, unsigned)                                  \
  X(KIND, long)                                      \
  X(KIND, unsigned long)                             \
  X(KIND, long long)                                 \
  X(KIND, unsigned long long)
