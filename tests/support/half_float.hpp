// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host conversions between float and the 16-bit element types mirror::cuda::half and
// mirror::cuda::bfloat16, for tests: to build inputs and references without a GPU, and for the
// scripted NCCL's arithmetic (fake_nccl.cpp), which rounds as CUDA's conversions do.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mirror/backends/cuda/element_type.hpp>

namespace mirror::test {

/// The value of a binary16 (exact in float).
inline float to_float(cuda::half h) {
  const std::uint32_t sign = (h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 0x1f, man = h.bits & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: value man * 2^-24
    float f = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign != 0 ? -f : f;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
/// The value of a bfloat16 (exact in float).
inline float to_float(cuda::bfloat16 b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
/// f rounded to the 16-bit float type H (cuda::half or cuda::bfloat16), as CUDA's _rn conversions do.
template <class H>
H from_float(float f);
/// f rounded to the nearest bfloat16 (ties to even; a NaN stays a quiet NaN).
template <>
inline cuda::bfloat16 from_float(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((bits >> 16) | 0x40u)};  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<std::uint16_t>(bits >> 16)};
}
/// f rounded to the nearest IEEE binary16 (ties to even; subnormals, infinities and NaN too).
template <>
inline cuda::half from_float(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return {static_cast<std::uint16_t>(sign | 0x7e00u)};
  if (abs >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to infinity
  if (abs < 0x38800000u) {  // below half's smallest normal: a multiple of 2^-24, rounded to even
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float units = a * 16777216.0f;  // exact: a power-of-two scale
    float r = std::nearbyint(units);      // round to nearest even (the default mode)
    return {static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r))};
  }
  std::uint32_t v = abs - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return {static_cast<std::uint16_t>(sign | (v >> 13))};
}

}  // namespace mirror::test
