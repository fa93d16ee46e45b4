// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The element-wise kernels of the CUDA backend, declared for host code. Defined in
/// `backends/cuda/kernels.cu` (compiled by nvcc into libmirror_cuda_kernels, explicitly
/// instantiated per element type); this header needs no CUDA header, so g++ compiles its users.
///
/// Each function enqueues one kernel on `stream` (a `cudaStream_t`) of the current device and
/// returns the `cudaError_t` of the launch as an int (0 = success): callers turn it into a
/// `mirror::backend_error`. Pointers must be reachable from the current device.

#include <mirror/backends/cuda/element_type.hpp>
#include <cstddef>
#include <mirror/reduce_op.hpp>

namespace mirror::cuda::impl {

/// dst[i] = dst[i] op src[i] for i < n (mean sums; the division is `launch_divide`).
int launch_combine(void* stream, ReduceOp op, detail::element_kind type, void* dst, const void* src, std::size_t n) noexcept;

/// p[i] = p[i] / count for i < n, in the element type (integers truncate, as C++ `/`).
int launch_divide(void* stream, detail::element_kind type, void* p, std::size_t n, std::size_t count) noexcept;

/// The most parts `launch_fold_into_all` takes in one launch.
inline constexpr int max_fold_parts = 16;

/// For i < n: parts[0][i] op parts[1][i] op ... op parts[count - 1][i], folded in that order
/// with every step rounded to the element type, divided by count for mean, written to every
/// parts[j][i]: the same bits as launch_combine from parts[0] through parts[count - 1] followed
/// by launch_divide, in one pass that reads and writes each part once. 1 <= count <=
/// max_fold_parts.
int launch_fold_into_all(void* stream, ReduceOp op, detail::element_kind type, void* const* parts, int count,
                         std::size_t n) noexcept;

}  // namespace mirror::cuda::impl
