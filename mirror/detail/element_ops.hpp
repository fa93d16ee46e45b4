// SPDX-License-Identifier: Apache-2.0
#pragma once
// Element-wise reduction arithmetic on host memory, shared by every CPU code path so that all
// of them combine values with exactly the same operations (bitwise-identical results).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <cstdint>
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

/// `min` and `max` of floating-point values are IEEE 754-2019's minimum and maximum (C23's
/// fminimum, fmaximum; TensorFlow's reduce_min, reduce_max): a NaN operand gives a NaN, and -0 is
/// below +0. So neither depends on the order the replicas are combined in (std::min and
/// std::max do: std::min(NaN, 1) is NaN, std::min(1, NaN) is 1). The NaN is `a` when `a` is one,
/// else `b`. Integers: the smaller or larger.
template <class E>
constexpr E minimum(E a, E b) noexcept {
  if constexpr (std::is_floating_point_v<E>) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return __builtin_signbit(a) ? a : b;  // +0 and -0, or one value
    return a < b ? a : b;
  } else {
    return b < a ? b : a;
  }
}
/// See minimum.
template <class E>
constexpr E maximum(E a, E b) noexcept {
  if constexpr (std::is_floating_point_v<E>) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return __builtin_signbit(a) ? b : a;
    return a < b ? b : a;
  } else {
    return a < b ? b : a;
  }
}

/// The type a scalar sum or product of E is computed in: E for floating point; for integers an
/// unsigned type at least as wide as unsigned int, whose wrap-around gives the two's-complement
/// bits of E's (a signed overflow is undefined behaviour, and a product of two unsigned shorts
/// promotes to int and can overflow it).
template <class E>
using scalar_arith_t =
    std::conditional_t<std::is_integral_v<E>,
                       std::conditional_t<(sizeof(E) < sizeof(unsigned)), unsigned,
                                          typename std::make_unsigned<std::conditional_t<std::is_integral_v<E>, E, int>>::type>,
                       E>;

/// a `op` b, for op in {sum, mean (summed here, divided later), min, max, prod}.
template <class E>
constexpr E combine(ReduceOp op, E a, E b) noexcept {
  using A = scalar_arith_t<E>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return static_cast<E>(static_cast<A>(a) + static_cast<A>(b));
    case ReduceOp::prod: return static_cast<E>(static_cast<A>(a) * static_cast<A>(b));
    case ReduceOp::min: return minimum(a, b);
    case ReduceOp::max: return maximum(a, b);
  }
  return a;
}

/// The integer type of E's size, whose bits a floating-point group's min and max select.
template <class E>
using bits_t = std::conditional_t<sizeof(E) == 4, std::int32_t, std::int64_t>;

/// The type whose arithmetic the vector loops use for sums and products: for integers the
/// unsigned one, whose wrap-around gives the bits of the scalar path's conversion back to E
/// (vectors of signed char or short add without promotion, and a signed overflow there is
/// undefined behaviour, which UBSan reports).
template <class E>
using wrapping_t = typename std::conditional_t<std::is_integral_v<E>, std::make_unsigned<E>,
                                               std::type_identity<E>>::type;

/// dst[i] = dst[i] op src[i] for i < n, element-wise, so the bits are a serial loop's.
///
/// The switch is hoisted, and the loop over whole 16-byte groups is written with GCC's vector
/// extensions: one SSE2 (or NEON) operation per group, the instructions GCC's auto-vectoriser would
/// choose, without the vectoriser's and the unroller's work in every header-only translation unit
/// (docs/design.md\#compile-time). (Floating-point min and max select bits, so that they are minimum
/// and maximum above: equal values take the OR (min: -0 wins) or the AND (max: +0 wins) of their
/// bits, which are the same bits unless the values are zeros of both signs, and a NaN in dst stays,
/// one in src replaces dst, as the comparison of anything with a NaN is false.)
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
    typedef wrapping_t<E> wrapping_group __attribute__((vector_size(16)));  // sums and products
    constexpr std::size_t w = 16 / sizeof(E);
    const std::size_t whole = n - n % w;
    // memcpy: the elements need only E's alignment; each is one unaligned load or store.
    group a, b;
    wrapping_group u, v;
#define MIRROR_DETAIL_GROUPS(A, B, RESULT)       \
  for (; i < whole; i += w) {                    \
    __builtin_memcpy(&A, dst + i, sizeof A);     \
    __builtin_memcpy(&B, src + i, sizeof B);     \
    A = RESULT;                                  \
    __builtin_memcpy(dst + i, &A, sizeof A);     \
  }                                              \
  break;
    if constexpr (std::is_floating_point_v<E>) {
      typedef bits_t<E> bits_group __attribute__((vector_size(16)));
      bits_group x, y;
      // a < b is false for a NaN operand: then y (src); a NaN in dst is kept by the last select.
#define MIRROR_DETAIL_FLOAT_GROUPS(FIRST, EQUAL)                         \
  for (; i < whole; i += w) {                                          \
    __builtin_memcpy(&a, dst + i, sizeof a);                           \
    __builtin_memcpy(&b, src + i, sizeof b);                           \
    __builtin_memcpy(&x, &a, sizeof x);                                \
    __builtin_memcpy(&y, &b, sizeof y);                                \
    bits_group r = FIRST ? x : y;                                      \
    r = a == b ? (EQUAL) : r;                                          \
    r = a != a ? x : r;                                                \
    __builtin_memcpy(dst + i, &r, sizeof r);                           \
  }                                                                    \
  break;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::mean: MIRROR_DETAIL_GROUPS(u, v, u + v)
        case ReduceOp::prod: MIRROR_DETAIL_GROUPS(u, v, u * v)
        case ReduceOp::min: MIRROR_DETAIL_FLOAT_GROUPS(a < b, x | y)
        case ReduceOp::max: MIRROR_DETAIL_FLOAT_GROUPS(b < a, x & y)
      }
#undef MIRROR_DETAIL_FLOAT_GROUPS
    } else {
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::mean: MIRROR_DETAIL_GROUPS(u, v, u + v)
        case ReduceOp::prod: MIRROR_DETAIL_GROUPS(u, v, u * v)
        case ReduceOp::min: MIRROR_DETAIL_GROUPS(a, b, b < a ? b : a)
        case ReduceOp::max: MIRROR_DETAIL_GROUPS(a, b, a < b ? b : a)
      }
    }
#undef MIRROR_DETAIL_GROUPS
  }
  // The rest (less than a group; all of it for long double): one loop for every op, the
  // switch inside, rather than four (docs/design.md#compile-time): this is at most 15 elements
  // per call.
  for (; i < n; ++i) dst[i] = combine(op, dst[i], src[i]);
}

/// How many sources a caller hands sum_many at a time (it reads all it is given in one pass over
/// dst): eight streams side by side, and a pointer array that fits on the stack.
inline constexpr std::size_t combine_pass = 8;

/// Whether sum_many has a vector loop for E (GCC's vector extensions, E at most 8 bytes).
template <class E>
inline constexpr bool has_sum_many =
#if defined(__GNUC__)
    sizeof(E) <= 8;
#else
    false;
#endif

/// dst[i] = (...(dst[i] + src[0][i]) + ...) + src[count-1][i] for i < n, n a multiple of
/// 16 / sizeof(E) (whole 16-byte groups): the sources in order, so the bits are a serial
/// loop's. `src` holds E pointers as `const void*` (an array that callers of any element type
/// fill); dst overlaps no source. For E with has_sum_many only.
///
/// Why not count calls of combine_into: each reads one source as a single stream and loads and
/// stores dst once per source. Reading up to combine_pass sources side by side keeps as many
/// streams in flight and touches dst once per pass, which is faster from L3 and more so from
/// DRAM (the chunk-owner all-reduce of 8 and 16 replicas; bench/all_reduce_bench.cpp). For one
/// source combine_into is faster, so callers pass two or more. Only sum (and mean, a sum until
/// divided), the reductions of training: every loop here is compiled per element type in every
/// header-only translation unit (docs/design.md\#compile-time).
template <class E>
void sum_many(void* to, const void* const* src, std::size_t count, std::size_t n) noexcept {
#if defined(__GNUC__)
  if constexpr (has_sum_many<E>) {
    // (dst untyped in the signature: detail::element_kernels points at this function itself,
    // with no wrapper to compile per element type.)
    E* __restrict const dst = static_cast<E*>(to);
    typedef wrapping_t<E> group __attribute__((vector_size(16)));
    constexpr std::size_t w = 16 / sizeof(E);
    // Sources in pairs: one source per trip is slower, from DRAM most of all.
    for (std::size_t i = 0; i < n; i += w) {
      group a, b, c;
      __builtin_memcpy(&a, dst + i, sizeof a);
      std::size_t j = 0;
      for (; j + 2 <= count; j += 2) {
        __builtin_memcpy(&b, static_cast<const E*>(src[j]) + i, sizeof b);
        __builtin_memcpy(&c, static_cast<const E*>(src[j + 1]) + i, sizeof c);
        a = a + b;
        a = a + c;
      }
      if (j < count) {
        __builtin_memcpy(&b, static_cast<const E*>(src[j]) + i, sizeof b);
        a = a + b;
      }
      __builtin_memcpy(dst + i, &a, sizeof a);
    }
  }
#endif
  (void)to, (void)src, (void)count, (void)n;
}

/// In place, two buffers: a[i] = b[i] = a[i] + b[i] for i < n, n a multiple of 16 / sizeof(E)
/// (whole 16-byte groups); a and b do not overlap. The bits are a serial loop's. For E with
/// has_sum_many only.
///
/// Why: the chunk-owner all-reduce's block loop copies the first buffer's block into an
/// accumulator, adds the second's and copies the sum back into both (5 vector loads and 4 stores
/// per 16 bytes); adding in registers and storing the sum into both is 2 and 2, the same lines in
/// the same order. With more buffers one such pass is slower than the block loop, so only two
/// (bench/results/hand_blocked.md has the measurements).
template <class E>
void sum_pair_in_place(void* a, void* b, std::size_t n) noexcept {
#if defined(__GNUC__)
  if constexpr (has_sum_many<E>) {
    typedef wrapping_t<E> group __attribute__((vector_size(16)));
    constexpr std::size_t w = 16 / sizeof(E);
    E* __restrict const x = static_cast<E*>(a);
    E* __restrict const y = static_cast<E*>(b);
    for (std::size_t i = 0; i < n; i += w) {
      group u, v;
      __builtin_memcpy(&u, x + i, sizeof u);
      __builtin_memcpy(&v, y + i, sizeof v);
      u = u + v;
      __builtin_memcpy(x + i, &u, sizeof u);
      __builtin_memcpy(y + i, &u, sizeof u);
    }
  }
#endif
  (void)a, (void)b, (void)n;
}

/// out[i] = a[i] + b[i] for i < n, a as the left operand (the bits of a serial loop's sum of a,
/// then b). out may be a or b itself (every group is loaded from both before it is stored) but
/// overlaps them in no other way. Any n: whole 16-byte groups in vectors (for E with
/// has_sum_many), the rest one by one.
///
/// Why: reduce_scatter's sum of two replicas (ops::ChunkOwnerAllReduce) folded each 8 KiB block
/// into an accumulator, reading one buffer's block, then the other's; this reads both side by
/// side in one pass, in well under the block fold's time from DRAM: the streams, not the
/// block's copies, cost the time (bench/gather_scatter_bench.cpp measures reduce_scatter).
template <class E>
void sum_pair_into(E* out, const E* a, const E* b, std::size_t n) noexcept {
  std::size_t i = 0;
#if defined(__GNUC__)
  if constexpr (has_sum_many<E>) {
    typedef wrapping_t<E> group __attribute__((vector_size(16)));
    constexpr std::size_t w = 16 / sizeof(E);
    for (; i + w <= n; i += w) {
      group u, v;
      __builtin_memcpy(&u, a + i, sizeof u);
      __builtin_memcpy(&v, b + i, sizeof v);
      u = u + v;
      __builtin_memcpy(out + i, &u, sizeof u);
    }
  }
#endif
  for (; i < n; ++i) out[i] = combine(ReduceOp::sum, a[i], b[i]);
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
#if defined(__GNUC__)
  // Floating types in 16-byte groups, the last one zero-filled (0 / count raises nothing): a
  // vector division rounds as the scalar one does, and no loop is left for GCC's vectoriser,
  // whose work on the plain loop below cost every header-only translation unit more compiler
  // instructions. (Integers have no vector division on x86: they keep the plain loop.)
  if constexpr (std::is_floating_point_v<E> && sizeof(E) <= 8) {
    typedef E group __attribute__((vector_size(16)));
    constexpr std::size_t w = 16 / sizeof(E);
    const group d = group{} + static_cast<E>(count);
    std::size_t i = 0;
    for (; i + w <= n; i += w) {
      group a;
      __builtin_memcpy(&a, p + i, sizeof a);
      a = a / d;
      __builtin_memcpy(p + i, &a, sizeof a);
    }
    if (i < n) {
      group a{};
      __builtin_memcpy(&a, p + i, (n - i) * sizeof(E));
      a = a / d;
      __builtin_memcpy(p + i, &a, (n - i) * sizeof(E));
    }
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) p[i] = divide(p[i], count);
}

// Instantiated once, in libmirror_threads, for a separately compiled program (separate_compilation.hpp).
#define MIRROR_DETAIL_ELEMENT_OPS_INSTANCES(KIND, E)                                             \
  KIND void combine_into<E>(ReduceOp, E* __restrict, const E* __restrict, std::size_t) noexcept; \
  KIND void sum_many<E>(void*, const void* const*, std::size_t, std::size_t) noexcept; \
  KIND void divide_all<E>(E*, std::size_t, std::size_t) noexcept;
#if MIRROR_DETAIL_EXTERN_TEMPLATES
MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_ELEMENT_OPS_INSTANCES, extern template)
#endif

}  // namespace mirror::detail
