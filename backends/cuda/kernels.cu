// SPDX-License-Identifier: Apache-2.0
// The element-wise kernels of the CUDA backend (declared in kernels.hpp). Kept deliberately
// simple: one grid-stride loop per operation, combining in the element type exactly like the
// host code in mirror/detail/element_ops.hpp, so GPU and CPU results have the same bits.
// 16-bit floats are combined in float and rounded back (round to nearest even).

#include <mirror/backends/cuda/kernels.hpp>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace mirror::cuda::impl {
namespace {

// How an element type computes: T itself, or float for the 16-bit floats.
template <class T>
struct arith {
  using type = T;
  __device__ static type load(T x) { return x; }
  __device__ static T store(type x) { return x; }
};
template <>
struct arith<__half> {
  using type = float;
  __device__ static float load(__half x) { return __half2float(x); }
  __device__ static __half store(float x) { return __float2half_rn(x); }
};
template <>
struct arith<__nv_bfloat16> {
  using type = float;
  __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

// min and max as mirror::detail::minimum/maximum (mirror/detail/element_ops.hpp): for floating
// types IEEE 754-2019's minimum and maximum (a NaN operand gives NaN, -0 below +0), so the result
// does not depend on the order the replicas are combined in.
template <class V>
__device__ V minimum(V a, V b) {
  if constexpr (std::is_floating_point_v<V>) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return signbit(a) ? a : b;
    return a < b ? a : b;
  } else {
    return b < a ? b : a;
  }
}
template <class V>
__device__ V maximum(V a, V b) {
  if constexpr (std::is_floating_point_v<V>) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return signbit(a) ? b : a;
    return a < b ? b : a;
  } else {
    return a < b ? b : a;
  }
}

// a op b in the arithmetic type (mean sums; its division comes last).
template <class V>
__device__ V combine_one(ReduceOp op, V a, V b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return static_cast<V>(a + b);
    case ReduceOp::prod: return static_cast<V>(a * b);
    case ReduceOp::min: return minimum(a, b);
    case ReduceOp::max: return maximum(a, b);
  }
  return a;
}

template <class T>
__global__ void combine_kernel(ReduceOp op, T* __restrict__ dst, const T* __restrict__ src, std::size_t n) {
  using A = arith<T>;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = A::store(combine_one(op, A::load(dst[i]), A::load(src[i])));
  }
}

template <class T>
__device__ T divide_one(T x, std::size_t count) {
  if constexpr (std::is_floating_point_v<T>) {
    return x / static_cast<T>(count);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(static_cast<long long>(x) / static_cast<long long>(count));
  } else {
    return static_cast<T>(static_cast<unsigned long long>(x) / count);
  }
}

template <class T>
__global__ void divide_kernel(T* p, std::size_t n, std::size_t count) {
  using A = arith<T>;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = A::store(divide_one(A::load(p[i]), count));
  }
}

// The parts of one fold, by value: a kernel parameter (constant memory), so no copy of the
// pointer list has to reach the device first.
template <class T>
struct fold_parts {
  T* p[max_fold_parts];
};

// Each thread folds its elements across the parts, then writes the result to every part: each
// element of each part is read once before any part's element is written, by the same thread.
// The loops over parts are unrolled to max_fold_parts with a run-time guard, so every index into
// `parts` is a constant: a run-time index would make each thread copy the 128-byte pointer list
// into local memory first, which costs more than the fold itself while a thread has few elements.
template <class T>
__global__ void fold_kernel(ReduceOp op, fold_parts<T> parts, int count, std::size_t n) {
  using A = arith<T>;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    T acc = parts.p[0][i];
#pragma unroll
    for (int r = 1; r < max_fold_parts; ++r) {
      if (r < count) acc = A::store(combine_one(op, A::load(acc), A::load(parts.p[r][i])));
    }
    if (op == ReduceOp::mean) acc = A::store(divide_one(A::load(acc), static_cast<std::size_t>(count)));
#pragma unroll
    for (int r = 0; r < max_fold_parts; ++r) {
      if (r < count) parts.p[r][i] = acc;
    }
  }
}

constexpr unsigned threads_per_block = 256;
// Enough blocks to fill an H100/H200 (132 SMs x 8 resident blocks of 256) several times over;
// larger arrays are covered by the grid-stride loops.
constexpr std::size_t max_blocks = 8192;

unsigned blocks_for(std::size_t n) {
  const std::size_t b = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(b < max_blocks ? b : max_blocks);
}

// A launch reports its failure only through cudaGetLastError(), which also returns whatever an
// earlier call on this thread left there (cudaEventQuery's cudaErrorNotReady, an error already
// thrown as a backend_error): cleared first, so the check after the launch is the launch's own.
// A sticky error is not lost: the launch itself fails with it again.
void clear_stale_error() noexcept { (void)cudaGetLastError(); }

}  // namespace

/// Typed launchers, explicitly instantiated below for every supported element type.
template <class T>
int combine_as(void* stream, ReduceOp op, void* dst, const void* src, std::size_t n) noexcept {
  if (n == 0) return 0;
  clear_stale_error();
  combine_kernel<T><<<blocks_for(n), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(
      op, static_cast<T*>(dst), static_cast<const T*>(src), n);
  return static_cast<int>(cudaGetLastError());
}

template <class T>
int divide_as(void* stream, void* p, std::size_t n, std::size_t count) noexcept {
  if (n == 0) return 0;
  clear_stale_error();
  divide_kernel<T><<<blocks_for(n), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<T*>(p), n,
                                                                                               count);
  return static_cast<int>(cudaGetLastError());
}

template <class T>
int fold_as(void* stream, ReduceOp op, void* const* parts, int count, std::size_t n) noexcept {
  if (n == 0) return 0;
  if (count < 1 || count > max_fold_parts) return static_cast<int>(cudaErrorInvalidValue);
  fold_parts<T> p{};
  for (int r = 0; r < count; ++r) p.p[r] = static_cast<T*>(parts[r]);
  clear_stale_error();
  fold_kernel<T><<<blocks_for(n), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(op, p, count, n);
  return static_cast<int>(cudaGetLastError());
}

#define MIRROR_CUDA_INSTANTIATE(T)                                                             \
  template int combine_as<T>(void*, ReduceOp, void*, const void*, std::size_t) noexcept; \
  template int divide_as<T>(void*, void*, std::size_t, std::size_t) noexcept;             \
  template int fold_as<T>(void*, ReduceOp, void* const*, int, std::size_t) noexcept;
MIRROR_CUDA_INSTANTIATE(float)
MIRROR_CUDA_INSTANTIATE(double)
MIRROR_CUDA_INSTANTIATE(__half)
MIRROR_CUDA_INSTANTIATE(__nv_bfloat16)
MIRROR_CUDA_INSTANTIATE(std::int32_t)
MIRROR_CUDA_INSTANTIATE(std::int64_t)
MIRROR_CUDA_INSTANTIATE(std::uint8_t)
#undef MIRROR_CUDA_INSTANTIATE

namespace {
// Calls `f.template operator()<T>()` with T the device type of `type`'s elements (CUDA's __half
// and __nv_bfloat16 for the 16-bit floats): the one dispatch from the run-time tag to the kernels.
template <class F>
int with_element_type(detail::element_kind type, F&& f) {
  switch (type.code()) {
    case kind_code<float>: return f.template operator()<float>();
    case kind_code<double>: return f.template operator()<double>();
    case kind_code<half>: return f.template operator()<__half>();
    case kind_code<bfloat16>: return f.template operator()<__nv_bfloat16>();
    case kind_code<std::int32_t>: return f.template operator()<std::int32_t>();
    case kind_code<std::int64_t>: return f.template operator()<std::int64_t>();
    case kind_code<std::uint8_t>: return f.template operator()<std::uint8_t>();
  }
  return static_cast<int>(cudaErrorInvalidValue);
}
}  // namespace

int launch_combine(void* stream, ReduceOp op, detail::element_kind type, void* dst, const void* src, std::size_t n) noexcept {
  return with_element_type(type, [&]<class T>() { return combine_as<T>(stream, op, dst, src, n); });
}

int launch_divide(void* stream, detail::element_kind type, void* p, std::size_t n, std::size_t count) noexcept {
  return with_element_type(type, [&]<class T>() { return divide_as<T>(stream, p, n, count); });
}

int launch_fold_into_all(void* stream, ReduceOp op, detail::element_kind type, void* const* parts, int count,
                         std::size_t n) noexcept {
  return with_element_type(type, [&]<class T>() { return fold_as<T>(stream, op, parts, count, n); });
}

}  // namespace mirror::cuda::impl
