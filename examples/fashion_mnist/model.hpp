// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The MLP 784-256-128-10 (ReLU, softmax cross-entropy) of the Fashion-MNIST example: its
/// parameters as one Hana struct (one mirror variable, one fused all-reduce), and the forward and
/// backward passes over one replica's rows with Eigen, single-threaded.

#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE  // one replica = one thread; mirror provides the parallelism
#endif
#include <Eigen/Core>

#include <algorithm>
#include <boost/hana/define_struct.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>
#include <mirror/matrix.hpp>

namespace fashion_mnist {

inline constexpr int in_features = 784, hidden1 = 256, hidden2 = 128, out_classes = 10;

/// The parameters of the three layers, with leaves of type `V`: `std::vector<float>` for the
/// model itself (a `MirroredVariable` leaf), `std::span<float>` for views of gradient buffers
/// (all-reduced in place). Weights are row-major `[in, out]`.
template <class V>
struct Layers {
  BOOST_HANA_DEFINE_STRUCT(Layers, (V, w1), (V, b1), (V, w2), (V, b2), (V, w3), (V, b3));
};
using Params = Layers<std::vector<float>>;
using ParamSpans = Layers<std::span<float>>;

/// Parameters and the optimiser's state: the model's one variable.
struct State {
  BOOST_HANA_DEFINE_STRUCT(State, (Params, params), (Params, velocity));
};

/// Number of floats in each leaf, in declaration order.
inline constexpr std::size_t leaf_sizes[6] = {
    std::size_t{in_features} * hidden1, hidden1, std::size_t{hidden1} * hidden2, hidden2,
    std::size_t{hidden2} * out_classes, out_classes};

/// Zero parameters of the right shapes.
inline Params zero_params() {
  return {std::vector<float>(leaf_sizes[0]), std::vector<float>(leaf_sizes[1]), std::vector<float>(leaf_sizes[2]),
          std::vector<float>(leaf_sizes[3]), std::vector<float>(leaf_sizes[4]), std::vector<float>(leaf_sizes[5])};
}

/// A small, fully specified generator (splitmix64), so that a seed gives the same model and
/// the same shuffles with every standard library.
struct rng {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1].
  double uniform() noexcept { return (double(next() >> 11) + 1.0) * 0x1.0p-53; }
  /// Uniform in [0, n).
  std::size_t below(std::size_t n) noexcept { return static_cast<std::size_t>(next() % n); }
  /// Standard normal (Box-Muller).
  double normal() noexcept {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
};

/// He initialisation: weights N(0, 2 / fan_in), biases 0.
inline Params init_params(std::uint64_t seed) {
  rng g{seed};
  Params p = zero_params();
  auto fill = [&](std::vector<float>& w, int fan_in) {
    const double sd = std::sqrt(2.0 / fan_in);
    for (float& x : w) x = static_cast<float>(g.normal() * sd);
  };
  fill(p.w1, in_features);
  fill(p.w2, hidden1);
  fill(p.w3, hidden2);
  return p;
}

/// One replica's scratch buffers for up to `max_rows` rows, and its gradient buffers.
class Workspace {
 public:
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<RowMat>;
  using ConstMap = Eigen::Map<const RowMat>;

  explicit Workspace(std::size_t max_rows = 0) { reserve(max_rows); }

  void reserve(std::size_t max_rows) {
    if (max_rows <= max_rows_) return;
    max_rows_ = max_rows;
    x_.resize(max_rows * in_features);
    a1_.resize(max_rows * hidden1);
    a2_.resize(max_rows * hidden2);
    z3_.resize(max_rows * out_classes);
    d2_.resize(max_rows * hidden2);
    d1_.resize(max_rows * hidden1);
  }

  /// Views of the gradient buffers, in the layout of `Params`: what is all-reduced.
  ParamSpans grads() noexcept {
    return {grads_.w1, grads_.b1, grads_.w2, grads_.b2, grads_.w3, grads_.b3};
  }

  /// Forward pass over `pixels` (rows x 784 bytes, scaled here to [0, 1]): leaves the inputs,
  /// activations and logits in the workspace.
  void forward(const Params& p, mirror::matrix_view<const std::uint8_t> pixels) {
    const auto n = static_cast<Eigen::Index>(pixels.rows());
    reserve(pixels.rows());
    Map X(x_.data(), n, in_features);
    X = Eigen::Map<const Eigen::Matrix<std::uint8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
            pixels.data.data(), n, in_features)
            .cast<float>() /
        255.0f;
    Map A1(a1_.data(), n, hidden1), A2(a2_.data(), n, hidden2), Z3(z3_.data(), n, out_classes);
    product(A1, X, plain, ConstMap(p.w1.data(), in_features, hidden1), plain);
    A1 = (A1.rowwise() + row(p.b1)).cwiseMax(0.0f);
    product(A2, A1, plain, ConstMap(p.w2.data(), hidden1, hidden2), plain);
    A2 = (A2.rowwise() + row(p.b2)).cwiseMax(0.0f);
    product(Z3, A2, plain, ConstMap(p.w3.data(), hidden2, out_classes), plain);
    Z3.rowwise() += row(p.b3);
  }

  /// The predicted class of row i of the last forward pass.
  int predicted(std::size_t i) const noexcept {
    const float* z = z3_.data() + i * out_classes;
    return static_cast<int>(std::max_element(z, z + out_classes) - z);
  }

  /// Forward and backward over one replica's rows of pixels. Writes, per row, the cross-entropy loss into
  /// `losses` and 1 or 0 (correct or not) into `correct`, and into the gradient buffers the SUM
  /// over these rows of the per-row gradients divided by `global_rows` (the global batch's size):
  /// summing the replicas' buffers gives the global batch's mean gradient exactly, ragged or not.
  /// `ready(k)` is called as gradient buffer k (in grads()' order: w1, b1, w2, b2, w3, b3) becomes
  /// final, the last layer's first (ctx.gradient_buckets starts its buckets from there).
  template <class Ready = void (*)(std::size_t)>
  void forward_backward(const Params& p, mirror::matrix_view<const std::uint8_t> x,
                        std::span<const std::int32_t> labels, std::size_t global_rows, std::span<float> losses,
                        std::span<float> correct, Ready&& ready = [](std::size_t) {}) {
    const std::size_t rows = x.rows();
    const auto n = static_cast<Eigen::Index>(rows);
    if (rows == 0) {  // a replica left without rows (ragged last batch) still takes part
      zero_grads();
      for (std::size_t k = 6; k-- > 0;) ready(k);
      return;
    }
    forward(p, x);
    // Softmax cross-entropy; the logits become dL/dz3 = (softmax - onehot) / global_rows.
    const float scale = 1.0f / static_cast<float>(global_rows);
    for (std::size_t i = 0; i < rows; ++i) {
      float* z = z3_.data() + i * out_classes;
      const int y = labels[i];
      const int guess = static_cast<int>(std::max_element(z, z + out_classes) - z);
      const float top = z[guess];
      float sum = 0.0f;
      for (int c = 0; c < out_classes; ++c) sum += std::exp(z[c] - top);
      losses[i] = std::log(sum) - (z[y] - top);
      correct[i] = guess == y ? 1.0f : 0.0f;
      const float inv = scale / sum;
      for (int c = 0; c < out_classes; ++c) z[c] = std::exp(z[c] - top) * inv;
      z[y] -= scale;
    }
    ConstMap X(x_.data(), n, in_features);
    Map A1(a1_.data(), n, hidden1), A2(a2_.data(), n, hidden2), D3(z3_.data(), n, out_classes);
    Map D2(d2_.data(), n, hidden2), D1(d1_.data(), n, hidden1);
    Map G1(grads_.w1.data(), in_features, hidden1), G2(grads_.w2.data(), hidden1, hidden2),
        G3(grads_.w3.data(), hidden2, out_classes);

    product(G3, A2, transposed, D3, plain);
    column_sums(D3, grads_.b3);
    ready(5);
    ready(4);
    product(D2, D3, plain, ConstMap(p.w3.data(), hidden2, out_classes), transposed);
    D2 = (A2.array() > 0.0f).select(D2, 0.0f);
    product(G2, A1, transposed, D2, plain);
    column_sums(D2, grads_.b2);
    ready(3);
    ready(2);
    product(D1, D2, plain, ConstMap(p.w2.data(), hidden1, hidden2), transposed);
    D1 = (A1.array() > 0.0f).select(D1, 0.0f);
    product(G1, X, transposed, D1, plain);
    column_sums(D1, grads_.b1);
    ready(1);
    ready(0);
  }

 private:
  enum operand { plain, transposed };

  /// c = op(a) * op(b), every matrix row-major and contiguous, overwriting c. With a BLAS this
  /// is one sgemm with beta = 0: Eigen's `c.noalias() = a * b` first zeroes c and then has the
  /// BLAS accumulate into it, an extra write and read of c per product (the 784x256 weight
  /// gradient is 800 KB; memset was ~3 % of a step's CPU time in `perf record`).
  template <class A, class B>
  static void product(Map c, const A& a, operand ta, const B& b, operand tb) {
#if FASHION_MNIST_BLAS
    // Row-major c (m x n) is column-major c^T (n x m) = op(b)^T op(a)^T: swap the operands; a
    // row-major matrix read column-major is its own transpose, so the flags stay as given.
    const int m = static_cast<int>(c.rows()), n = static_cast<int>(c.cols());
    const int k = static_cast<int>(ta == plain ? a.cols() : a.rows());
    const int lda = static_cast<int>(a.cols()), ldb = static_cast<int>(b.cols());
    const char opa = ta == plain ? 'N' : 'T', opb = tb == plain ? 'N' : 'T';
    const float one = 1.0f, zero = 0.0f;
    sgemm_(&opb, &opa, &n, &m, &k, &one, b.data(), &ldb, a.data(), &lda, &zero, c.data(), &n);
#else
    if (ta == plain && tb == plain) c.noalias() = a * b;
    else if (ta == plain) c.noalias() = a * b.transpose();
    else if (tb == plain) c.noalias() = a.transpose() * b;
    else c.noalias() = a.transpose() * b.transpose();
#endif
  }

  /// out[j] = the sum of column j of `d`, row after row, in that order whatever the buffers'
  /// addresses. Eigen's vectorised `colwise().sum()` over these heap buffers gave bits that
  /// depended on where the heap put them: runs of the same 2-worker training, whose allocations
  /// interleave with the communication thread's, ended with different losses and accuracies.
  static void column_sums(const Map& d, std::vector<float>& out) {
    std::fill(out.begin(), out.end(), 0.0f);
    for (Eigen::Index i = 0; i < d.rows(); ++i) {
      const float* r = d.data() + i * d.cols();
      for (std::size_t j = 0; j < out.size(); ++j) out[j] += r[j];
    }
  }
  static Eigen::Map<const Eigen::RowVectorXf> row(const std::vector<float>& v) {
    return {v.data(), static_cast<Eigen::Index>(v.size())};
  }
  static Eigen::Map<Eigen::RowVectorXf> row(std::vector<float>& v) {
    return {v.data(), static_cast<Eigen::Index>(v.size())};
  }
  void zero_grads() {
    for (auto* g : {&grads_.w1, &grads_.b1, &grads_.w2, &grads_.b2, &grads_.w3, &grads_.b3}) {
      std::fill(g->begin(), g->end(), 0.0f);
    }
  }

  std::size_t max_rows_ = 0;
  std::vector<float> x_, a1_, a2_, z3_, d2_, d1_;
  Params grads_ = zero_params();
};

/// One momentum SGD step (PyTorch's form) on matching parts of a parameter, its velocity and its
/// gradient: `v = momentum * v + g; p -= lr * v` (plain SGD when momentum is 0: v is not read).
/// Memory-bound (five streams): one pass, every element loaded once, vectorised by GCC. The
/// replicated optimiser calls it on whole leaves, the sharded one on each replica's cut.
inline void momentum_step(std::span<float> p, std::span<float> v, std::span<const float> grad, float lr,
                          float momentum) noexcept {
  float* const pp = p.data();
  const float* const g = grad.data();
  if (momentum == 0.0f) {
    for (std::size_t i = 0; i < p.size(); ++i) pp[i] -= lr * g[i];
    return;
  }
  float* const vv = v.data();
  for (std::size_t i = 0; i < p.size(); ++i) {
    vv[i] = momentum * vv[i] + g[i];
    pp[i] -= lr * vv[i];
  }
}

/// The momentum step on the whole model (every replica's, in the replicated optimiser).
inline void apply_momentum(State& s, const ParamSpans& g, float lr, float momentum) {
  momentum_step(s.params.w1, s.velocity.w1, g.w1, lr, momentum);
  momentum_step(s.params.b1, s.velocity.b1, g.b1, lr, momentum);
  momentum_step(s.params.w2, s.velocity.w2, g.w2, lr, momentum);
  momentum_step(s.params.b2, s.velocity.b2, g.b2, lr, momentum);
  momentum_step(s.params.w3, s.velocity.w3, g.w3, lr, momentum);
  momentum_step(s.params.b3, s.velocity.b3, g.b3, lr, momentum);
}

}  // namespace fashion_mnist
