// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The GPU trainer's model (the MLP of model.hpp) written once, for two executors: the CUDA one
/// in gpu_model.cu (cuBLAS products, small kernels) and a plain host one in
/// tests/examples/gpu_steps_test.cpp, which checks this file's layout, product shapes and
/// per-element arithmetic against model.hpp's CPU model without a GPU. Plain C++ (no CUDA
/// header): `FM_HOST_DEVICE` marks what the kernels call.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#define FM_HOST_DEVICE __host__ __device__
#else
#define FM_HOST_DEVICE
#endif

namespace fashion_mnist::gpu {

inline constexpr int in_features = 784, hidden1 = 256, hidden2 = 128, out_classes = 10;

/// The parameters (and the momentum, and the gradients) as ONE contiguous float array, layers in
/// model.hpp's order (w1, b1, w2, b2, w3, b3; weights row-major [in, out]): the gradient
/// all-reduce is one in-place leaf, with nothing to pack. Every offset is a multiple of 4 floats,
/// so each layer starts 16-byte aligned for cuBLAS.
struct layout {
  static constexpr std::size_t w1 = 0;
  static constexpr std::size_t b1 = w1 + std::size_t{in_features} * hidden1;
  static constexpr std::size_t w2 = b1 + hidden1;
  static constexpr std::size_t b2 = w2 + std::size_t{hidden1} * hidden2;
  static constexpr std::size_t w3 = b2 + hidden2;
  static constexpr std::size_t b3 = w3 + std::size_t{hidden2} * out_classes;
  static constexpr std::size_t total = b3 + out_classes;
};
static_assert(layout::b1 % 4 == 0 && layout::w2 % 4 == 0 && layout::b2 % 4 == 0 && layout::w3 % 4 == 0 &&
              layout::b3 % 4 == 0);

/// The parameters of model.hpp's layers (w1, b1, w2, b2, w3, b3, each as model.hpp stores it)
/// packed into `layout`.
inline std::vector<float> pack(std::span<const float> w1, std::span<const float> b1, std::span<const float> w2,
                               std::span<const float> b2, std::span<const float> w3, std::span<const float> b3) {
  std::vector<float> out(layout::total);
  const std::pair<std::span<const float>, std::size_t> parts[] = {
      {w1, layout::w1}, {b1, layout::b1}, {w2, layout::w2}, {b2, layout::b2}, {w3, layout::w3}, {b3, layout::b3}};
  for (const auto& [from, at] : parts) std::copy(from.begin(), from.end(), out.begin() + static_cast<std::ptrdiff_t>(at));
  return out;
}

/// A product c = op(a) * op(b) of contiguous row-major matrices (c is m x n, the inner dimension
/// k; a is stored k x m when transposed, else m x k; b is n x k when transposed, else k x n), as
/// the column-major call cuBLAS takes: a row-major matrix read column-major is its transpose, so
/// c^T = op(b)^T op(a)^T is computed with the operands swapped and the flags kept (model.hpp's
/// sgemm_ call does the same).
struct gemm_call {
  bool transa, transb;  // cublasSgemm's
  int m, n, k;
  const float* a;
  int lda;
  const float* b;
  int ldb;
  float* c;
  int ldc;
};
inline gemm_call row_major_gemm(float* c, int m, int n, int k, const float* a, bool ta, const float* b,
                                bool tb) noexcept {
  return {tb, ta, n, m, k, b, tb ? k : n, a, ta ? m : k, c, n};
}

/// One replica's buffers, as the step functions see them (device pointers on the GPU, host ones in
/// the test). `rows` is the number of rows of this step; every activation has room for it.
struct buffers {
  const std::uint8_t* pixels;  // rows x 784
  const std::int32_t* labels;  // rows
  float* x;                    // rows x 784: pixels / 255
  float* a1;                   // rows x 256: relu(x w1 + b1)
  float* a2;                   // rows x 128: relu(a1 w2 + b2)
  float* z3;                   // rows x 10: logits, then dL/dz3
  float* d2;                   // rows x 128
  float* d1;                   // rows x 256
  float* loss;                 // rows: each row's cross-entropy
  float* correct;              // rows: 1 or 0
  const float* params;         // layout::total
  float* grads;                // layout::total
};

// ---- per-element arithmetic, the same on both executors ----

/// x / 255, as model.hpp scales pixels.
FM_HOST_DEVICE inline float scale_pixel(std::uint8_t p) { return static_cast<float>(p) / 255.0f; }

/// relu(v + bias).
FM_HOST_DEVICE inline float bias_relu(float v, float bias) {
  const float s = v + bias;
  return s > 0.0f ? s : 0.0f;
}

/// The backward mask of a ReLU: the gradient where the activation was positive, else 0.
FM_HOST_DEVICE inline float relu_grad(float d, float activation) { return activation > 0.0f ? d : 0.0f; }

/// Softmax cross-entropy of one row of logits `z` (bias `b3` not yet added) with label `y`: the
/// loss, whether the arg max (the first, as std::max_element) is `y`, and z replaced by
/// dL/dz = (softmax - onehot) * scale, scale = 1 / global batch rows (model.hpp's formula).
FM_HOST_DEVICE inline void softmax_cross_entropy(float* z, const float* b3, int y, float scale, float& loss,
                                                 float& correct) {
  int guess = 0;
  for (int c = 0; c < out_classes; ++c) {
    z[c] += b3[c];
    if (z[c] > z[guess]) guess = c;
  }
  const float top = z[guess];
  float sum = 0.0f;
  for (int c = 0; c < out_classes; ++c) sum += expf(z[c] - top);
  loss = logf(sum) - (z[y] - top);
  correct = guess == y ? 1.0f : 0.0f;
  const float inv = scale / sum;
  for (int c = 0; c < out_classes; ++c) z[c] = expf(z[c] - top) * inv;
  z[y] -= scale;
}

/// Whether the arg max of logits `z` plus bias `b3` (the first, as std::max_element) is `y`.
FM_HOST_DEVICE inline bool predicts(const float* z, const float* b3, int y) {
  int guess = 0;
  float top = z[0] + b3[0];
  for (int c = 1; c < out_classes; ++c) {
    const float v = z[c] + b3[c];
    if (v > top) {
      top = v;
      guess = c;
    }
  }
  return guess == y;
}

/// SGD with momentum, model.hpp's (PyTorch's) form, on one parameter: v = m v + g; p -= lr v.
FM_HOST_DEVICE inline void momentum_step(float& p, float& v, float g, float lr, float momentum) {
  if (momentum == 0.0f) {
    p -= lr * g;
    return;
  }
  v = momentum * v + g;
  p -= lr * v;
}

// ---- the step, once for both executors ----
//
// `Exec` provides:
//   gemm(float* c, int m, int n, int k, const float* a, bool ta, const float* b, bool tb)
//     c (m x n) = op(a) * op(b), every matrix row-major and contiguous, c overwritten
//     (row_major_gemm says how);
//   scale_pixels(float* x, const std::uint8_t* p, std::size_t count);
//   bias_relu(float* a, const float* bias, std::size_t rows, int cols);
//   softmax(const buffers&, std::size_t rows, float scale);  // softmax_cross_entropy per row
//   column_sums(float* out, const float* d, std::size_t rows, int cols);  // out[c] = sum_r d[r, c]
//   relu_grad(float* d, const float* a, std::size_t count);

/// The forward pass over `rows` rows: logits (bias not yet added) in z3.
template <class Exec>
void forward(Exec& e, const buffers& b, std::size_t rows) {
  const int n = static_cast<int>(rows);
  const float* p = b.params;
  e.scale_pixels(b.x, b.pixels, rows * in_features);
  e.gemm(b.a1, n, hidden1, in_features, b.x, false, p + layout::w1, false);
  e.bias_relu(b.a1, p + layout::b1, rows, hidden1);
  e.gemm(b.a2, n, hidden2, hidden1, b.a1, false, p + layout::w2, false);
  e.bias_relu(b.a2, p + layout::b2, rows, hidden2);
  e.gemm(b.z3, n, out_classes, hidden2, b.a2, false, p + layout::w3, false);
}

/// Forward and backward over `rows` rows (> 0): per-row loss and correctness, and in `grads` the
/// sum over these rows of the per-row gradients divided by `global_rows`, as model.hpp's
/// Workspace::forward_backward. `ready(k)` is called once the work producing gradient k (in
/// layout order: w1, b1, w2, b2, w3, b3 = 0..5) has been issued, last layer first, so that a
/// bucketed all-reduce can start it while the earlier layers' backward goes on.
template <class Exec, class Ready>
void forward_backward(Exec& e, const buffers& b, std::size_t rows, std::size_t global_rows, Ready&& ready) {
  const int n = static_cast<int>(rows);
  const float* p = b.params;
  float* g = b.grads;
  forward(e, b, rows);
  e.softmax(b, rows, 1.0f / static_cast<float>(global_rows));
  e.gemm(g + layout::w3, hidden2, out_classes, n, b.a2, true, b.z3, false);
  ready(std::size_t{4});
  e.column_sums(g + layout::b3, b.z3, rows, out_classes);
  ready(std::size_t{5});
  e.gemm(b.d2, n, hidden2, out_classes, b.z3, false, p + layout::w3, true);
  e.relu_grad(b.d2, b.a2, rows * hidden2);
  e.gemm(g + layout::w2, hidden1, hidden2, n, b.a1, true, b.d2, false);
  ready(std::size_t{2});
  e.column_sums(g + layout::b2, b.d2, rows, hidden2);
  ready(std::size_t{3});
  e.gemm(b.d1, n, hidden1, hidden2, b.d2, false, p + layout::w2, true);
  e.relu_grad(b.d1, b.a1, rows * hidden1);
  e.gemm(g + layout::w1, in_features, hidden1, n, b.x, true, b.d1, false);
  ready(std::size_t{0});
  e.column_sums(g + layout::b1, b.d1, rows, hidden1);
  ready(std::size_t{1});
}
/// forward_backward with no one to tell.
template <class Exec>
void forward_backward(Exec& e, const buffers& b, std::size_t rows, std::size_t global_rows) {
  forward_backward(e, b, rows, global_rows, [](std::size_t) {});
}

}  // namespace fashion_mnist::gpu
