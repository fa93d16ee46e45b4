// SPDX-License-Identifier: Apache-2.0
#pragma once
// Element-wise reduction arithmetic on host memory, shared by every CPU code path so that all
// of them combine values with exactly the same operations (bitwise-identical results).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <limits>
#include <mirror/reduce_op.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <type_traits>

namespace mirror::detail {

/// The element types host collectives accept: every arithmetic type except bool and the
/// character types. (bool has no sum; chars are text, not numbers.)
template <class E>
inline constexpr bool is_host_element =
    std::is_arithmetic_v<E> && !std::is_same_v<E, bool> && !std::is_same_v<E, char> &&
    !std::is_same_v<E, wchar_t> && !std::is_same_v<E, char8_t> && !std::is_same_v<E, char16_t> &&
    !std::is_same_v<E, char32_t>;

template <class E>
constexpr void require_host_element() {
  static_assert(is_host_element<E>,
                "mirror: this element type cannot be reduced; supported element types are float, "
                "double, long double, signed char, unsigned char, short, unsigned short, int, "
                "unsigned, long, unsigned long, long long, unsigned long long (std::int8_t ... "
                "std::uint64_t) — convert bool or char leaves to one of them");
}

/// a `op` b, for op in {sum, mean (summed here, divided later), min, max, prod}.
template <class E>
constexpr E combine(ReduceOp op, E a, E b) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return static_cast<E>(a + b);
    case ReduceOp::prod: return static_cast<E>(a * b);
    case ReduceOp::min: return b < a ? b : a;
    case ReduceOp::max: return a < b ? b : a;
  }
  return a;
}

/// dst[i] = dst[i] op src[i] for i < n, element-wise, so the bits are a serial loop's.
///
/// The switch is hoisted, and the loop over whole 16-byte groups is written with GCC's vector
/// extensions: one SSE2 (or NEON) operation per group, the same instructions GCC's
/// auto-vectoriser chose for the earlier loop over 64-byte blocks, at parity in a micro-benchmark
/// (within 8 % either way, L1- and L2-resident, float, double, int). That loop made the vectoriser
/// and the complete unroller work through four fully unrolled loops per element type, which cost
/// a header-only translation unit reducing floats and doubles a tenth of its compile time; this
/// one compiles in half the time. (min and max compare as written, so a NaN behaves as in the
/// serial loop: `src < dst ? src : dst` keeps dst unless src is smaller.)
template <class E>
void combine_into(ReduceOp op, E* __restrict dst, const E* __restrict src, std::size_t n) noexcept {
#if defined(__GNUC__)
  constexpr bool vectors = sizeof(E) <= 8;  // no vectors of long double
#else
  constexpr bool vectors = false;
#endif
  std::size_t i = 0;
  if constexpr (vectors) {
    typedef E group __attribute__((vector_size(16)));
    constexpr std::size_t w = 16 / sizeof(E);
    const std::size_t whole = n - n % w;
    // memcpy: the elements need only E's alignment; each is one unaligned load or store.
    group a, b;
#define MIRROR_DETAIL_GROUPS(RESULT)             \
  for (; i < whole; i += w) {                    \
    __builtin_memcpy(&a, dst + i, sizeof a);     \
    __builtin_memcpy(&b, src + i, sizeof b);     \
    a = RESULT;                                  \
    __builtin_memcpy(dst + i, &a, sizeof a);     \
  }                                              \
  break;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean: MIRROR_DETAIL_GROUPS(a + b)
      case ReduceOp::prod: MIRROR_DETAIL_GROUPS(a * b)
      case ReduceOp::min: MIRROR_DETAIL_GROUPS(b < a ? b : a)
      case ReduceOp::max: MIRROR_DETAIL_GROUPS(a < b ? b : a)
    }
#undef MIRROR_DETAIL_GROUPS
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      for (; i < n; ++i) dst[i] = static_cast<E>(dst[i] + src[i]);
      return;
    case ReduceOp::prod:
      for (; i < n; ++i) dst[i] = static_cast<E>(dst[i] * src[i]);
      return;
    case ReduceOp::min:
      for (; i < n; ++i) dst[i] = src[i] < dst[i] ? src[i] : dst[i];
      return;
    case ReduceOp::max:
      for (; i < n; ++i) dst[i] = dst[i] < src[i] ? src[i] : dst[i];
      return;
  }
}

/// The value x with x op v == v for every v: the result of reducing nothing.
template <class E>
constexpr E identity(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return E(0);
    case ReduceOp::prod: return E(1);
    case ReduceOp::min:
      return std::numeric_limits<E>::has_infinity ? std::numeric_limits<E>::infinity()
                                                  : std::numeric_limits<E>::max();
    case ReduceOp::max:
      return std::numeric_limits<E>::has_infinity ? -std::numeric_limits<E>::infinity()
                                                  : std::numeric_limits<E>::lowest();
  }
  return E(0);
}

/// Divides by a count for `mean`, in the element type: integers truncate like C++ `/`.
/// (Integers divide in the widest type of their signedness, so a count above the element type's
/// range is still right: int8 -100 over 200 replicas is 0, not garbage.)
template <class E>
constexpr E divide(E x, std::size_t count) noexcept {
  if constexpr (std::is_floating_point_v<E>) {
    return x / static_cast<E>(count);
  } else if constexpr (std::is_signed_v<E>) {
    return static_cast<E>(static_cast<long long>(x) / static_cast<long long>(count));
  } else {
    return static_cast<E>(static_cast<unsigned long long>(x) / count);
  }
}

template <class E>
void divide_all(E* p, std::size_t n, std::size_t count) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = divide(p[i], count);
}

// Instantiated once, in libmirror_threads, for a separately compiled program (separate_compilation.hpp).
#define MIRROR_DETAIL_ELEMENT_OPS_INSTANCES(KIND, E)                                             \
  KIND void combine_into<E>(ReduceOp, E* __restrict, const E* __restrict, std::size_t) noexcept; \
  KIND void divide_all<E>(E*, std::size_t, std::size_t) noexcept;
#if MIRROR_DETAIL_EXTERN_TEMPLATES
MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_ELEMENT_OPS_INSTANCES, extern template)
#endif

}  // namespace mirror::detail
