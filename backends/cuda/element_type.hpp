// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The element types the CUDA kernels are built for, as seen by host code compiled with g++.
///
/// `mirror::cuda::half` and `mirror::cuda::bfloat16` are 16-bit storage types with the bit
/// layout of CUDA's `__half` and `__nv_bfloat16`, so device buffers of either can be named on
/// the host without `<cuda_fp16.h>`. The kernels compute on them in float and round back.

#include <cstdint>
#include <type_traits>
#include <mirror/detail/element_kind.hpp>

namespace mirror::cuda {

/// IEEE binary16 storage (the bits of `__half`).
struct half {
  std::uint16_t bits;  ///< sign, 5 exponent bits, 10 mantissa bits
};
/// bfloat16 storage (the bits of `__nv_bfloat16`).
struct bfloat16 {
  std::uint16_t bits;  ///< the upper 16 bits of an IEEE binary32
};

/// Whether the kernels are built for E (for constraints and tests).
template <class E>
inline constexpr bool has_kernels =
    std::is_same_v<std::remove_cv_t<E>, float> || std::is_same_v<std::remove_cv_t<E>, double> ||
    std::is_same_v<std::remove_cv_t<E>, half> || std::is_same_v<std::remove_cv_t<E>, bfloat16> ||
    (std::is_integral_v<E> && !std::is_same_v<std::remove_cv_t<E>, bool> &&
     ((std::is_signed_v<E> && (sizeof(E) == 4 || sizeof(E) == 8)) || (std::is_unsigned_v<E> && sizeof(E) == 1)));

}  // namespace mirror::cuda

/// half and bfloat16 as the run-time element tag names them (kernel dispatch, NCCL datatypes, the
/// agreement check): both 2 bytes, told apart by category.
template <>
struct mirror::detail::element_kind_traits<mirror::cuda::half> {
  static constexpr element_kind value{element_kind::category::floating, 2};
};
template <>
struct mirror::detail::element_kind_traits<mirror::cuda::bfloat16> {
  static constexpr element_kind value{element_kind::category::bfloat, 2};
};

namespace mirror::cuda {

/// False for every E: a static_assert that names E fails only when instantiated.
template <class E>
inline constexpr bool always_false = false;

/// The element kind of E, for an E the kernels are built for: float, double, half, bfloat16,
/// 32- and 64-bit signed integers, 8-bit unsigned. Any other E fails to compile, with the fix.
template <class E>
constexpr detail::element_kind kernel_kind_of() noexcept {
  if constexpr (has_kernels<E>) {
    return detail::element_kind_of<E>();
  } else {
    static_assert(always_false<E>,
                  "mirror::devices::Cuda: this element type has no CUDA kernels; supported element types are "
                  "float, double, mirror::cuda::half, mirror::cuda::bfloat16, std::int32_t, std::int64_t and "
                  "std::uint8_t — convert the leaf to one of them");
    return {};
  }
}

/// The element kind's code() for E, for switching over element kinds (kernel dispatch).
template <class E>
inline constexpr std::uint16_t kind_code = kernel_kind_of<E>().code();

}  // namespace mirror::cuda
