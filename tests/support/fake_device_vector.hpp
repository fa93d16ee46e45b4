// SPDX-License-Identifier: Apache-2.0
#pragma once
// A stand-in for thrust::device_vector (which needs nvcc) in the compile-fail tests and the CUDA
// backend's no-GPU tests: an owning leaf that declares its elements device-resident. The host
// memory behind it is never read: its users only compile, or never call, what takes it.
#include <mirror/leaf_traits.hpp>
#include <span>
#include <vector>

struct FakeDeviceVector {
  std::vector<float> storage;
};
template <>
struct mirror::leaf_traits<FakeDeviceVector> {
  static constexpr bool is_leaf = true;
  using element_type = float;
  static constexpr int rank = 1;
  static constexpr bool is_view = false;
  static constexpr bool resizable = false;
  static constexpr bool device_resident = true;
  static std::span<float> elements(FakeDeviceVector& x) noexcept { return x.storage; }
  static std::span<const float> elements(const FakeDeviceVector& x) noexcept { return x.storage; }
};
