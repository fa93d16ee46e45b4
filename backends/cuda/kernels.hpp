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

#include <backends/cuda/element_type.hpp>
#include <cstddef>
#include <mirror/reduce_op.hpp>

namespace mirror::cuda::impl {

/// dst[i] = dst[i] op src[i] for i < n (mean sums; the division is `launch_divide`).
int launch_combine(void* stream, ReduceOp op, element_type type, void* dst, const void* src, std::size_t n) noexcept;

/// p[i] = p[i] / count for i < n, in the element type (integers truncate, as C++ `/`).
int launch_divide(void* stream, element_type type, void* p, std::size_t n, std::size_t count) noexcept;

}  // namespace mirror::cuda::impl
