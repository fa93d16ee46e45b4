// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `thrust::device_vector<E>` as a leaf (include only from files compiled by nvcc, after
/// `<mirror/mirror.hpp>`). An owning leaf: `ctx.all_reduce(op, v)` returns a new device_vector
/// holding the result, on the replica's device. `Strategy::reduce` of a value holding them
/// reduces on the devices and synchronises replica 0's stream (never a host read). Thrust copies on the legacy default stream,
/// with which the replicas' (blocking) streams are ordered.

#include <cstddef>
#include <span>
#include <type_traits>
#include <thrust/device_vector.h>
#include <mirror/leaf_traits.hpp>

namespace mirror {

template <class E, class A>
struct leaf_traits<thrust::device_vector<E, A>, std::enable_if_t<std::is_arithmetic_v<E>>> {
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 1;
  static constexpr bool is_view = false;
  // GPU memory: mirror never reads it on the host (mirror/leaf_traits.hpp, docs/cuda.md#leaves).
  static constexpr bool device_resident = true;
  static constexpr bool resizable = true;
  static std::span<E> elements(thrust::device_vector<E, A>& x) noexcept {
    return {thrust::raw_pointer_cast(x.data()), x.size()};
  }
  static std::span<const E> elements(const thrust::device_vector<E, A>& x) noexcept {
    return {thrust::raw_pointer_cast(x.data()), x.size()};
  }
  static void resize(thrust::device_vector<E, A>& x, std::size_t n) { x.resize(n); }
};

}  // namespace mirror
