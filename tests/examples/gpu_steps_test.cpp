// SPDX-License-Identifier: Apache-2.0
// The GPU trainer's model (examples/fashion_mnist/gpu_steps.hpp) without a GPU: its step sequence
// runs here on a host executor whose products take exactly the column-major arguments
// gpu_model.cu hands cublasSgemm, and must give what model.hpp's CPU model gives (losses,
// predictions, all six gradients, the momentum step). What this cannot check is the kernels'
// launch code and cuBLAS itself: the GPU kit runs those (tools/gpu_kit).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>
#include "examples/fashion_mnist/gpu_steps.hpp"
#include "examples/fashion_mnist/model.hpp"
#include "biased_params.hpp"

namespace fm = fashion_mnist;
namespace gpu = fashion_mnist::gpu;

namespace {

// cublasSgemm's definition, on the host: C = op(A) op(B), column-major, alpha 1, beta 0. First
// the leading-dimension rules for which cuBLAS returns CUBLAS_STATUS_INVALID_VALUE.
void column_major_sgemm(const gpu::gemm_call& g) {
  REQUIRE(g.lda >= std::max(1, g.transa ? g.k : g.m));
  REQUIRE(g.ldb >= std::max(1, g.transb ? g.n : g.k));
  REQUIRE(g.ldc >= std::max(1, g.m));
  for (int j = 0; j < g.n; ++j) {
    for (int i = 0; i < g.m; ++i) {
      float s = 0.0f;
      for (int l = 0; l < g.k; ++l) {
        const float a = g.transa ? g.a[l + i * g.lda] : g.a[i + l * g.lda];
        const float b = g.transb ? g.b[j + l * g.ldb] : g.b[l + j * g.ldb];
        s += a * b;
      }
      g.c[i + j * g.ldc] = s;
    }
  }
}

// gpu_steps.hpp's executor on the host: the same calls gpu_model.cu's kernels make, in loops.
struct host_exec {
  void gemm(float* c, int m, int n, int k, const float* a, bool ta, const float* b, bool tb) const {
    column_major_sgemm(gpu::row_major_gemm(c, m, n, k, a, ta, b, tb));
  }
  void scale_pixels(float* x, const std::uint8_t* p, std::size_t n) const {
    for (std::size_t i = 0; i < n; ++i) x[i] = gpu::scale_pixel(p[i]);
  }
  void bias_relu(float* a, const float* bias, std::size_t rows, int cols) const {
    for (std::size_t i = 0; i < rows * static_cast<std::size_t>(cols); ++i) {
      a[i] = gpu::bias_relu(a[i], bias[i % static_cast<std::size_t>(cols)]);
    }
  }
  void softmax(const gpu::buffers& b, std::size_t rows, float scale) const {
    for (std::size_t r = 0; r < rows; ++r) {
      gpu::softmax_cross_entropy(b.z3 + r * gpu::out_classes, b.params + gpu::layout::b3, b.labels[r], scale, b.loss[r],
                                 b.correct[r]);
    }
  }
  void column_sums(float* out, const float* d, std::size_t rows, int cols) const {
    for (int c = 0; c < cols; ++c) {
      float s = 0.0f;
      for (std::size_t r = 0; r < rows; ++r) s += d[r * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
      out[c] = s;
    }
  }
  void relu_grad(float* d, const float* a, std::size_t n) const {
    for (std::size_t i = 0; i < n; ++i) d[i] = gpu::relu_grad(d[i], a[i]);
  }
};

struct host_model {
  std::size_t rows;
  std::vector<float> params, grads = std::vector<float>(gpu::layout::total);
  std::vector<float> x, a1, a2, z3, d2, d1, loss, correct;
  host_model(std::size_t n, std::vector<float> p)
      : rows(n), params(std::move(p)), x(n * gpu::in_features), a1(n * gpu::hidden1), a2(n * gpu::hidden2),
        z3(n * gpu::out_classes), d2(n * gpu::hidden2), d1(n * gpu::hidden1), loss(n), correct(n) {}
  gpu::buffers view(const std::vector<std::uint8_t>& pixels, const std::vector<std::int32_t>& labels) {
    return {pixels.data(), labels.data(), x.data(), a1.data(), a2.data(), z3.data(), d2.data(), d1.data(),
            loss.data(), correct.data(), params.data(), grads.data()};
  }
};

std::vector<float> packed(const fm::Params& p) { return gpu::pack(p.w1, p.b1, p.w2, p.b2, p.w3, p.b3); }

void require_close(std::span<const float> got, std::span<const float> want, const char* what) {
  REQUIRE(got.size() == want.size());
  float worst = 0.0f, scale = 0.0f;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  INFO(what << ": largest difference " << worst << ", largest value " << scale);
  REQUIRE(worst <= 1e-4f * std::max(scale, 1.0f));
}

}  // namespace

TEST_CASE("gpu steps: row_major_gemm's cuBLAS arguments give the row-major product, in every transposition",
          "[examples][gpu_steps]") {
  const int m = 3, n = 4, k = 5;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      // a is k x m stored when transposed, else m x k; b is n x k when transposed, else k x n.
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(i % 7) - 3.0f;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(i % 5) * 0.5f - 1.0f;
      auto A = [&](int i, int l) { return ta ? a[static_cast<std::size_t>(l * m + i)] : a[static_cast<std::size_t>(i * k + l)]; };
      auto B = [&](int l, int j) { return tb ? b[static_cast<std::size_t>(j * k + l)] : b[static_cast<std::size_t>(l * n + j)]; };
      std::vector<float> c(static_cast<std::size_t>(m * n), -99.0f);
      column_major_sgemm(gpu::row_major_gemm(c.data(), m, n, k, a.data(), ta, b.data(), tb));
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          float want = 0.0f;
          for (int l = 0; l < k; ++l) want += A(i, l) * B(l, j);
          INFO("ta " << ta << " tb " << tb << " at " << i << "," << j);
          REQUIRE(c[static_cast<std::size_t>(i * n + j)] == want);
        }
      }
    }
  }
}

TEST_CASE("gpu steps: the layout packs model.hpp's layers in order, each 16-byte aligned", "[examples][gpu_steps]") {
  STATIC_REQUIRE(gpu::layout::total == fm::leaf_sizes[0] + fm::leaf_sizes[1] + fm::leaf_sizes[2] + fm::leaf_sizes[3] +
                                           fm::leaf_sizes[4] + fm::leaf_sizes[5]);
  STATIC_REQUIRE(gpu::in_features == fm::in_features && gpu::hidden1 == fm::hidden1 && gpu::hidden2 == fm::hidden2 &&
                 gpu::out_classes == fm::out_classes);
  const fm::Params p = make_params(3);
  const std::vector<float> flat = packed(p);
  REQUIRE(std::equal(p.w2.begin(), p.w2.end(), flat.begin() + gpu::layout::w2));
  REQUIRE(std::equal(p.b3.begin(), p.b3.end(), flat.begin() + gpu::layout::b3));
  REQUIRE(flat.size() == gpu::layout::total);
}

TEST_CASE("gpu steps: forward and backward equal model.hpp's CPU model", "[examples][gpu_steps]") {
  for (const std::size_t rows : {std::size_t{1}, std::size_t{7}, std::size_t{32}}) {
    const std::size_t global_rows = 3 * rows + 1;  // a replica's share of a larger batch
    fm::rng g{rows};
    std::vector<std::uint8_t> pixels(rows * fm::in_features);
    std::vector<std::int32_t> labels(rows);
    for (auto& x : pixels) x = static_cast<std::uint8_t>(g.below(256));
    for (auto& y : labels) y = static_cast<std::int32_t>(g.below(fm::out_classes));
    const fm::Params p = make_params(11 + rows);

    fm::Workspace cpu(rows);
    std::vector<float> cpu_loss(rows), cpu_correct(rows);
    cpu.forward_backward(p, {std::span<const std::uint8_t>(pixels), std::size_t{fm::in_features}}, labels, global_rows, cpu_loss,
                         cpu_correct);

    host_model m(rows, packed(p));
    host_exec e;
    gpu::forward_backward(e, m.view(pixels, labels), rows, global_rows);
    require_close(m.loss, cpu_loss, "losses");
    REQUIRE(m.correct == cpu_correct);
    fm::ParamSpans want = cpu.grads();
    const std::vector<float> want_flat = gpu::pack(want.w1, want.b1, want.w2, want.b2, want.w3, want.b3);
    require_close(std::span<const float>(m.grads).subspan(gpu::layout::w1, gpu::layout::b1), std::span<const float>(want_flat).subspan(0, gpu::layout::b1), "w1's gradient");
    require_close(std::span<const float>(m.grads).subspan(gpu::layout::b1, gpu::layout::w2 - gpu::layout::b1),
                  std::span<const float>(want_flat).subspan(gpu::layout::b1, gpu::layout::w2 - gpu::layout::b1), "b1's gradient");
    require_close(std::span<const float>(m.grads).subspan(gpu::layout::w2), std::span<const float>(want_flat).subspan(gpu::layout::w2),
                  "the other layers' gradients");

    // Forward only, then the predictions, as evaluate() does.
    host_model f(rows, packed(p));
    gpu::forward(e, f.view(pixels, labels), rows);
    cpu.forward(p, {std::span<const std::uint8_t>(pixels), std::size_t{fm::in_features}});
    for (std::size_t r = 0; r < rows; ++r) {
      REQUIRE(gpu::predicts(f.z3.data() + r * gpu::out_classes, f.params.data() + gpu::layout::b3, labels[r]) ==
              (cpu.predicted(r) == labels[r]));
    }
  }
}

TEST_CASE("gpu steps: the momentum step is model.hpp's", "[examples][gpu_steps]") {
  for (const float momentum : {0.0f, 0.9f}) {
    fm::State s{make_params(5), make_params(6)};
    const fm::Params grad = make_params(7);
    std::vector<float> p = packed(s.params), v = packed(s.velocity);
    const std::vector<float> gflat = packed(grad);
    for (std::size_t i = 0; i < p.size(); ++i) gpu::momentum_step(p[i], v[i], gflat[i], 0.05f, momentum);
    fm::Params gcopy = grad;
    fm::apply_momentum(s, {gcopy.w1, gcopy.b1, gcopy.w2, gcopy.b2, gcopy.w3, gcopy.b3}, 0.05f, momentum);
    require_close(p, packed(s.params), "parameters");
    if (momentum != 0.0f) require_close(v, packed(s.velocity), "momentum");
  }
}
