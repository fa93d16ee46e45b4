// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The Fashion-MNIST model on a GPU (`--device cuda`), for host code compiled by g++: declared
/// here without CUDA headers, defined in gpu_model.cu (nvcc, cuBLAS). The arithmetic and the
/// order of the products are gpu_steps.hpp's, shared with a host test.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include "gpu_steps.hpp"

namespace fashion_mnist::gpu {

/// One replica's model on the GPU that is current when it is made: parameters, momentum and
/// gradients (each one device array in `layout`), activations for up to `max_rows` rows, the
/// rows' pixels and labels, the loss and accuracy totals, and a cuBLAS handle. Everything it does
/// is enqueued on `stream` (the replica's, a `cudaStream_t`), so it is ordered with the replica's
/// collectives and the host does not wait for the GPU, except in `take_totals` and `parameters`.
/// Errors: `mirror::backend_error` with the CUDA or cuBLAS status.
class replica {
 public:
  replica(void* stream, std::size_t max_rows, std::span<const float> initial_parameters);
  replica(replica&& other) noexcept;
  replica& operator=(replica&&) = delete;
  replica(const replica&) = delete;
  replica& operator=(const replica&) = delete;
  ~replica();

  /// Copies `rows` images (784 bytes each) and labels from host memory (`pinned` for the copy
  /// to be asynchronous) and runs forward and backward: the gradients become the sum over these
  /// rows of the per-row gradients divided by `global_rows`; the rows' loss and correct
  /// predictions join the totals. Zero rows (a ragged last batch) zero the gradients.
  /// `ready(k)`, when given, is called as the work producing gradient k (layout order: w1, b1,
  /// w2, b2, w3, b3 = 0..5) has been enqueued, last layer first (gpu_steps.hpp).
  void forward_backward(const std::uint8_t* pixels, const std::int32_t* labels, std::size_t rows,
                        std::size_t global_rows, const std::function<void(std::size_t)>& ready = nullptr);
  /// The gradient array (device memory, `layout::total` floats): what the replicas all-reduce.
  float* gradients() const noexcept;
  /// SGD with momentum from the (all-reduced) gradients.
  void apply_momentum(float lr, float momentum);
  /// Forward passes over `rows` rows, in chunks of `max_rows`: the correct predictions join
  /// the totals.
  void evaluate(const std::uint8_t* pixels, const std::int32_t* labels, std::size_t rows);
  /// {sum of losses, number of correct predictions} since the last take; waits for the stream.
  std::pair<double, double> take_totals();
  /// The parameters, copied to the host (waits for the stream).
  std::vector<float> parameters() const;

 private:
  struct state;
  state* s_;
};

/// Pins `bytes` of host memory at `p` (cudaHostRegister) while it lives, so that copies from it
/// are asynchronous: the host then runs ahead of the GPU. Must outlive the copies from it.
class pinned {
 public:
  pinned(const void* p, std::size_t bytes);
  pinned(const pinned&) = delete;
  pinned& operator=(const pinned&) = delete;
  ~pinned();

 private:
  void* p_ = nullptr;
};

/// "cuBLAS 13.0.2" (the library loaded at run time).
std::string cublas_version();

}  // namespace fashion_mnist::gpu
