// SPDX-License-Identifier: Apache-2.0
#pragma once
// Independent references for collective tests: integer-valued inputs (so every order of
// summation gives the same exact result) and a plain serial loop over replicas.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>
#include <mirror/reduce_op.hpp>

namespace mirror::test {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

/// The ">= 1M elements" size of the conformance matrix: 2^20 + 1 (divisible by none of the
/// replica counts). Sanitizer builds run 10-50x slower, so there it is 2^16 + 1: still past
/// every size threshold of every policy; the plain build covers the full size.
inline constexpr std::size_t large_size = sanitized ? (std::size_t{1} << 16) + 1 : (std::size_t{1} << 20) + 1;

inline constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::mean, ReduceOp::min, ReduceOp::max, ReduceOp::prod};
inline constexpr int replica_counts[] = {1, 2, 3, 4, 7, 8, 16};

/// Element i of replica r's input for `op`: small integers, so results are exact in every
/// element type; prod inputs are in {-1, 1, 2} so 16 replicas stay within int32.
template <class T>
T input_value(ReduceOp op, int r, std::size_t i) {
  if (op == ReduceOp::prod) {
    const std::size_t k = (static_cast<std::size_t>(r) * 5 + i * 3) % 7;
    return k == 0 ? T(2) : (k < 3 ? T(-1) : T(1));
  }
  return static_cast<T>(static_cast<int>((static_cast<std::size_t>(r) * 31 + i * 7 + 3) % 19) - 9);
}

/// input_value depends on i only through i % 19 (i % 7 for prod): it repeats every 133 elements,
/// so large inputs and references are built from one period (fast enough for 16 x 1M elements).
inline constexpr std::size_t input_period = 133;

template <class T>
void tile(std::vector<T>& v, std::size_t n) {
  const std::size_t p = std::min(n, input_period);
  v.resize(n);
  for (std::size_t i = p; i < n; i += p) std::copy_n(v.begin(), std::min(p, n - i), v.begin() + static_cast<std::ptrdiff_t>(i));
}

template <class T>
std::vector<T> input_vector(ReduceOp op, int r, std::size_t n) {
  std::vector<T> v(std::min(n, input_period));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = input_value<T>(op, r, i);
  tile(v, n);
  return v;
}

/// One step of a serial reference: `a op b` (`mean` sums; the caller divides once), with plain
/// C++ arithmetic and std::min / std::max (the references' inputs hold no NaN or signed zero).
template <class T>
T fold(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return static_cast<T>(a + b);
    case ReduceOp::prod: return static_cast<T>(a * b);
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
  }
  return a;
}

/// The serial reference: acc = x_0; acc = acc op x_r for r = 1..R-1; mean divides by R with `/`.
template <class T>
std::vector<T> serial_reference(ReduceOp op, int replicas, std::size_t n) {
  std::vector<T> out(std::min(n, input_period));
  for (std::size_t i = 0; i < out.size(); ++i) {
    T acc = input_value<T>(op, 0, i);
    for (int r = 1; r < replicas; ++r) acc = fold(op, acc, input_value<T>(op, r, i));
    if (op == ReduceOp::mean) acc = static_cast<T>(acc / static_cast<T>(replicas));
    out[i] = acc;
  }
  tile(out, n);
  return out;
}

/// One element of the serial reference as NCCL computes it: as serial_reference, except that a
/// floating-point `mean` is ncclAvg's, the sum in replica order of each input multiplied by 1/R
/// rounded to T (exact, and then equal to serial_reference's, where R is a power of two).
template <class T, class Input>
T nccl_fold(ReduceOp op, int replicas, Input&& x) {
  if (op == ReduceOp::mean && std::is_floating_point_v<T>) {
    const T scale = static_cast<T>(1.0 / static_cast<double>(replicas));
    T acc = static_cast<T>(x(0) * scale);
    for (int r = 1; r < replicas; ++r) acc = static_cast<T>(acc + static_cast<T>(x(r) * scale));
    return acc;
  }
  T acc = x(0);
  for (int r = 1; r < replicas; ++r) acc = fold(op, acc, x(r));
  if (op == ReduceOp::mean) acc = static_cast<T>(acc / static_cast<T>(replicas));
  return acc;
}

/// serial_reference as NCCL computes it (nccl_fold): the reference for ops::NcclAllReduce.
template <class T>
std::vector<T> nccl_reference(ReduceOp op, int replicas, std::size_t n) {
  std::vector<T> out(std::min(n, input_period));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = nccl_fold<T>(op, replicas, [&](int r) { return input_value<T>(op, r, i); });
  }
  tile(out, n);
  return out;
}

/// Bitwise equality (NaN-safe, distinguishes -0.0 from 0.0).
template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}

/// A device policy with `replicas` replicas and a test-friendly timeout.
template <class D>
D make_device(int replicas) {
  D d{};
  d.replicas = replicas;
  d.timeout = std::chrono::seconds(60);
  return d;
}

}  // namespace mirror::test
