// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cuda::device_span<E>`: a view of device memory, a leaf reduced in place.

#include <cstddef>
#include <span>
#include <type_traits>
#include <mirror/backends/cuda/element_type.hpp>
#include <mirror/leaf_traits.hpp>

namespace mirror::cuda {

/// `n` elements of type E at device address `data` (from `cudaMalloc`, a `device_buffer`, or
/// `thrust::raw_pointer_cast`). As a leaf it is a view: `ctx.all_reduce(op, device_span(p, n))`
/// reduces in every replica's own buffer, on the replicas' streams, and allocates nothing.
/// The host never reads it (`device_resident`): passing it to `Strategy::reduce` is a compile
/// error (a view leaf), and so is using it on a host device such as `devices::Threads`.
template <class E>
struct device_span {
  E* data = nullptr;     ///< device address of the first element
  std::size_t size = 0;  ///< elements
};

/// `device_span(p, n)` deduces E from the pointer.
template <class E>
device_span(E*, std::size_t) -> device_span<E>;

}  // namespace mirror::cuda

namespace mirror {

/// `cuda::device_span<E>` is a view leaf (`elements` hands the device address through; the CUDA
/// runtime's `attach` sees that it is device memory and uses it in place).
/// Elements: arithmetic types (those without kernels are refused by `kernel_kind_of` with the
/// supported list) and the 16-bit float types `cuda::half` and `cuda::bfloat16`, which only
/// device code computes on: a `device_span<cuda::half>` goes through every ops policy.
template <class E>
struct leaf_traits<cuda::device_span<E>,
                   std::enable_if_t<(std::is_arithmetic_v<E> || std::is_same_v<E, cuda::half> ||
                                     std::is_same_v<E, cuda::bfloat16>) &&
                                    !std::is_const_v<E>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 1;
  static constexpr bool is_view = true;
  // GPU memory: mirror never reads it on the host (mirror/leaf_traits.hpp, docs/cuda.md#leaves).
  static constexpr bool device_resident = true;
  static constexpr bool resizable = false;
  static std::span<E> elements(const cuda::device_span<E>& x) noexcept { return {x.data, x.size}; }
  ///@}
};

}  // namespace mirror
