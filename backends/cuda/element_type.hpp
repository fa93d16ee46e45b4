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

namespace mirror::cuda {

/// IEEE binary16 storage (the bits of `__half`).
struct half {
  std::uint16_t bits;  ///< sign, 5 exponent bits, 10 mantissa bits
};
/// bfloat16 storage (the bits of `__nv_bfloat16`).
struct bfloat16 {
  std::uint16_t bits;  ///< the upper 16 bits of an IEEE binary32
};

/// Tag of an element type the kernel library (kernels.cu) is instantiated for.
enum class element_type : int { f32, f64, f16, bf16, i32, i64, u8 };

/// False for every E: a static_assert that names E fails only when instantiated.
template <class E>
inline constexpr bool always_false = false;

/// The tag of E: float, double, half, bfloat16, 32- and 64-bit signed integers, 8-bit unsigned.
template <class E>
constexpr element_type element_type_of() noexcept {
  using T = std::remove_cv_t<E>;
  if constexpr (std::is_same_v<T, float>) {
    return element_type::f32;
  } else if constexpr (std::is_same_v<T, double>) {
    return element_type::f64;
  } else if constexpr (std::is_same_v<T, half>) {
    return element_type::f16;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return element_type::bf16;
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 4) {
    return element_type::i32;
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 8) {
    return element_type::i64;
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T> && sizeof(T) == 1 && !std::is_same_v<T, bool>) {
    return element_type::u8;
  } else {
    static_assert(always_false<E>,
                  "mirror::devices::Cuda: this element type has no CUDA kernels; supported element types are "
                  "float, double, mirror::cuda::half, mirror::cuda::bfloat16, std::int32_t, std::int64_t and "
                  "std::uint8_t — convert the leaf to one of them");
    return element_type::f32;
  }
}

/// Whether `element_type_of<E>()` is defined (for constraints and tests).
template <class E>
inline constexpr bool has_kernels =
    std::is_same_v<std::remove_cv_t<E>, float> || std::is_same_v<std::remove_cv_t<E>, double> ||
    std::is_same_v<std::remove_cv_t<E>, half> || std::is_same_v<std::remove_cv_t<E>, bfloat16> ||
    (std::is_integral_v<E> && !std::is_same_v<std::remove_cv_t<E>, bool> &&
     ((std::is_signed_v<E> && (sizeof(E) == 4 || sizeof(E) == 8)) || (std::is_unsigned_v<E> && sizeof(E) == 1)));

}  // namespace mirror::cuda
