// SPDX-License-Identifier: Apache-2.0
// The GPU side of the Fashion-MNIST trainer (declared in gpu_model.hpp): gpu_steps.hpp's model run
// by cuBLAS (the products) and small kernels (everything element-wise), all on the replica's
// stream. Deliberately plain: one thread per element or per row, grid-stride loops, sums in a
// fixed order (so a seed trains the same bits run after run on one GPU).

#include "gpu_model.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <string>
#include <mirror/error.hpp>

namespace fashion_mnist::gpu {
namespace {

[[noreturn]] void fail(cudaError_t e, const char* what) {
  (void)cudaGetLastError();
  throw mirror::backend_error(std::string("fashion_mnist (GPU): ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                                  cudaGetErrorString(e) + ")",
                              static_cast<long>(e));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(e, what);
}
void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw mirror::backend_error(std::string("fashion_mnist (GPU): ") + what + " failed: " + cublasGetStatusName(st) +
                                    " (" + cublasGetStatusString(st) + ")",
                                static_cast<long>(st));
  }
}
void check_launch(const char* what) { check(cudaGetLastError(), what); }

constexpr unsigned block = 256;
unsigned blocks(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + block - 1) / block, 4096));
}

__global__ void scale_pixels_kernel(float* x, const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] = scale_pixel(p[i]);
  }
}

__global__ void bias_relu_kernel(float* a, const float* bias, std::size_t n, int cols) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    a[i] = bias_relu(a[i], bias[i % static_cast<std::size_t>(cols)]);
  }
}

__global__ void relu_grad_kernel(float* d, const float* a, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    d[i] = relu_grad(d[i], a[i]);
  }
}

// One thread per row (10 logits each).
__global__ void softmax_kernel(float* z3, const float* b3, const std::int32_t* labels, float* loss, float* correct,
                               std::size_t rows, float scale) {
  for (std::size_t r = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; r < rows; r += std::size_t{gridDim.x} * blockDim.x) {
    softmax_cross_entropy(z3 + r * out_classes, b3, labels[r], scale, loss[r], correct[r]);
  }
}

__global__ void predict_kernel(const float* z3, const float* b3, const std::int32_t* labels, float* correct,
                               std::size_t rows) {
  for (std::size_t r = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; r < rows; r += std::size_t{gridDim.x} * blockDim.x) {
    correct[r] = predicts(z3 + r * out_classes, b3, labels[r]) ? 1.0f : 0.0f;
  }
}

// One thread per column, rows in order: the bias gradients.
__global__ void column_sums_kernel(float* out, const float* d, std::size_t rows, int cols) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  float s = 0.0f;
  for (std::size_t r = 0; r < rows; ++r) s += d[r * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
  out[c] = s;
}

__global__ void momentum_kernel(float* p, float* v, const float* g, std::size_t n, float lr, float momentum) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    momentum_step(p[i], v[i], g[i], lr, momentum);
  }
}

// One block: totals[0] += sum(loss), totals[1] += sum(correct), in a fixed order (strided partial
// sums, then a tree), so the printed loss is the same run after run.
__global__ void totals_kernel(double* totals, const float* loss, const float* correct, std::size_t rows) {
  __shared__ double l[block], c[block];
  double sl = 0, sc = 0;
  for (std::size_t i = threadIdx.x; i < rows; i += block) {
    if (loss != nullptr) sl += loss[i];
    sc += correct[i];
  }
  l[threadIdx.x] = sl;
  c[threadIdx.x] = sc;
  __syncthreads();
  for (unsigned half = block / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      l[threadIdx.x] += l[threadIdx.x + half];
      c[threadIdx.x] += c[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals[0] += l[0];
    totals[1] += c[0];
  }
}

// gpu_steps.hpp's executor on the GPU.
struct cuda_exec {
  cublasHandle_t blas;
  cudaStream_t stream;

  void gemm(float* c, int m, int n, int k, const float* a, bool ta, const float* b, bool tb) const {
    const gemm_call g = row_major_gemm(c, m, n, k, a, ta, b, tb);
    const float one = 1.0f, zero = 0.0f;
    check(cublasSgemm(blas, g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, g.transb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
                      &one, g.a, g.lda, g.b, g.ldb, &zero, g.c, g.ldc),
          "cublasSgemm");
  }
  void scale_pixels(float* x, const std::uint8_t* p, std::size_t n) const {
    scale_pixels_kernel<<<blocks(n), block, 0, stream>>>(x, p, n);
    check_launch("the pixel scaling kernel");
  }
  void bias_relu(float* a, const float* bias, std::size_t rows, int cols) const {
    const std::size_t n = rows * static_cast<std::size_t>(cols);
    bias_relu_kernel<<<blocks(n), block, 0, stream>>>(a, bias, n, cols);
    check_launch("the bias + ReLU kernel");
  }
  void softmax(const buffers& b, std::size_t rows, float scale) const {
    softmax_kernel<<<blocks(rows), block, 0, stream>>>(b.z3, b.params + layout::b3, b.labels, b.loss, b.correct, rows,
                                                       scale);
    check_launch("the softmax cross-entropy kernel");
  }
  void column_sums(float* out, const float* d, std::size_t rows, int cols) const {
    column_sums_kernel<<<(static_cast<unsigned>(cols) + block - 1) / block, block, 0, stream>>>(out, d, rows, cols);
    check_launch("the column sums kernel");
  }
  void relu_grad(float* d, const float* a, std::size_t n) const {
    relu_grad_kernel<<<blocks(n), block, 0, stream>>>(d, a, n);
    check_launch("the ReLU gradient kernel");
  }
};

template <class T>
T* device_array(std::size_t n, const char* what) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), what);
  return static_cast<T*>(p);
}

}  // namespace

struct replica::state {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::size_t max_rows = 0;
  float *params = nullptr, *velocity = nullptr, *grads = nullptr;
  float *x = nullptr, *a1 = nullptr, *a2 = nullptr, *z3 = nullptr, *d2 = nullptr, *d1 = nullptr;
  float *loss = nullptr, *correct = nullptr;
  std::uint8_t* pixels = nullptr;
  std::int32_t* labels = nullptr;
  double* totals = nullptr;

  ~state() {
    // Freed on the device they were made on, whatever the destroying thread has current.
    int previous = 0;
    const bool known = cudaGetDevice(&previous) == cudaSuccess;
    if (cudaSetDevice(device) == cudaSuccess) {
      if (stream != nullptr) (void)cudaStreamSynchronize(stream);
      if (blas != nullptr) (void)cublasDestroy(blas);
      for (void* p : {static_cast<void*>(params), static_cast<void*>(velocity), static_cast<void*>(grads),
                      static_cast<void*>(x), static_cast<void*>(a1), static_cast<void*>(a2), static_cast<void*>(z3),
                      static_cast<void*>(d2), static_cast<void*>(d1), static_cast<void*>(loss),
                      static_cast<void*>(correct), static_cast<void*>(pixels), static_cast<void*>(labels),
                      static_cast<void*>(totals)}) {
        (void)cudaFree(p);
      }
    }
    if (known) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
  }

  buffers view() const {
    return {pixels, labels, x, a1, a2, z3, d2, d1, loss, correct, params, grads};
  }

  // Host rows to the device, on the stream.
  void upload(const std::uint8_t* host_pixels, const std::int32_t* host_labels, std::size_t rows) const {
    check(cudaMemcpyAsync(pixels, host_pixels, rows * in_features, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync of the batch's pixels");
    check(cudaMemcpyAsync(labels, host_labels, rows * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync of the batch's labels");
  }
};

replica::replica(void* stream, std::size_t max_rows, std::span<const float> initial_parameters)
    : s_(new state) {
  try {
    if (initial_parameters.size() != layout::total) {
      throw mirror::error("fashion_mnist (GPU): " + std::to_string(initial_parameters.size()) +
                          " initial parameters, the model has " + std::to_string(layout::total));
    }
    state& s = *s_;
    check(cudaGetDevice(&s.device), "cudaGetDevice");
    s.stream = static_cast<cudaStream_t>(stream);
    s.max_rows = std::max<std::size_t>(max_rows, 1);
    s.params = device_array<float>(layout::total, "cudaMalloc of the parameters");
    s.velocity = device_array<float>(layout::total, "cudaMalloc of the momentum");
    s.grads = device_array<float>(layout::total, "cudaMalloc of the gradients");
    const std::size_t r = s.max_rows;
    s.x = device_array<float>(r * in_features, "cudaMalloc of the inputs");
    s.a1 = device_array<float>(r * hidden1, "cudaMalloc of the activations");
    s.a2 = device_array<float>(r * hidden2, "cudaMalloc of the activations");
    s.z3 = device_array<float>(r * out_classes, "cudaMalloc of the logits");
    s.d2 = device_array<float>(r * hidden2, "cudaMalloc of the activation gradients");
    s.d1 = device_array<float>(r * hidden1, "cudaMalloc of the activation gradients");
    s.loss = device_array<float>(r, "cudaMalloc of the losses");
    s.correct = device_array<float>(r, "cudaMalloc of the predictions");
    s.pixels = device_array<std::uint8_t>(r * in_features, "cudaMalloc of the batch's pixels");
    s.labels = device_array<std::int32_t>(r, "cudaMalloc of the batch's labels");
    s.totals = device_array<double>(2, "cudaMalloc of the totals");
    check(cublasCreate(&s.blas), "cublasCreate");
    check(cublasSetStream(s.blas, s.stream), "cublasSetStream");
    // The initial parameters are a host vector the caller may free once this returns: a
    // synchronous copy (it waits for the stream's earlier work, of which there is none yet).
    check(cudaMemcpyAsync(s.params, initial_parameters.data(), layout::total * sizeof(float), cudaMemcpyHostToDevice,
                          s.stream),
          "cudaMemcpyAsync of the initial parameters");
    check(cudaMemsetAsync(s.velocity, 0, layout::total * sizeof(float), s.stream), "cudaMemsetAsync");
    check(cudaMemsetAsync(s.totals, 0, 2 * sizeof(double), s.stream), "cudaMemsetAsync");
    check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
  } catch (...) {
    delete s_;
    throw;
  }
}

replica::replica(replica&& other) noexcept : s_(other.s_) { other.s_ = nullptr; }
replica::~replica() { delete s_; }

float* replica::gradients() const noexcept { return s_->grads; }

void replica::forward_backward(const std::uint8_t* pixels, const std::int32_t* labels, std::size_t rows,
                               std::size_t global_rows, const std::function<void(std::size_t)>& ready) {
  state& s = *s_;
  const auto tell = [&](std::size_t k) {
    if (ready) ready(k);
  };
  if (rows == 0) {  // a replica left without rows still takes part in the all-reduce
    check(cudaMemsetAsync(s.grads, 0, layout::total * sizeof(float), s.stream), "cudaMemsetAsync of the gradients");
    for (const std::size_t k : {4, 5, 2, 3, 0, 1}) tell(k);  // the order backward produces them
    return;
  }
  if (rows > s.max_rows) {
    throw mirror::error("fashion_mnist (GPU): " + std::to_string(rows) + " rows, room for " +
                        std::to_string(s.max_rows));
  }
  s.upload(pixels, labels, rows);
  cuda_exec e{s.blas, s.stream};
  gpu::forward_backward(e, s.view(), rows, global_rows, tell);
  totals_kernel<<<1, block, 0, s.stream>>>(s.totals, s.loss, s.correct, rows);
  check_launch("the totals kernel");
}

void replica::apply_momentum(float lr, float momentum) {
  state& s = *s_;
  momentum_kernel<<<blocks(layout::total), block, 0, s.stream>>>(s.params, s.velocity, s.grads, layout::total, lr,
                                                                 momentum);
  check_launch("the momentum kernel");
}

void replica::evaluate(const std::uint8_t* pixels, const std::int32_t* labels, std::size_t rows) {
  state& s = *s_;
  cuda_exec e{s.blas, s.stream};
  for (std::size_t first = 0; first < rows; first += s.max_rows) {
    const std::size_t n = std::min(s.max_rows, rows - first);
    s.upload(pixels + first * in_features, labels + first, n);
    gpu::forward(e, s.view(), n);
    predict_kernel<<<blocks(n), block, 0, s.stream>>>(s.z3, s.params + layout::b3, s.labels, s.correct, n);
    check_launch("the prediction kernel");
    totals_kernel<<<1, block, 0, s.stream>>>(s.totals, nullptr, s.correct, n);
    check_launch("the totals kernel");
  }
}

std::pair<double, double> replica::take_totals() {
  state& s = *s_;
  double host[2] = {0, 0};
  check(cudaMemcpyAsync(host, s.totals, sizeof host, cudaMemcpyDeviceToHost, s.stream), "cudaMemcpyAsync of the totals");
  check(cudaMemsetAsync(s.totals, 0, sizeof host, s.stream), "cudaMemsetAsync");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
  return {host[0], host[1]};
}

std::vector<float> replica::parameters() const {
  std::vector<float> out(layout::total);
  check(cudaMemcpyAsync(out.data(), s_->params, out.size() * sizeof(float), cudaMemcpyDeviceToHost, s_->stream),
        "cudaMemcpyAsync of the parameters");
  check(cudaStreamSynchronize(s_->stream), "cudaStreamSynchronize");
  return out;
}

pinned::pinned(const void* p, std::size_t bytes) {
  if (bytes == 0) return;
  // Portable: pinned for every GPU's context, as each replica copies from it.
  check(cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterPortable), "cudaHostRegister");
  p_ = const_cast<void*>(p);
}
pinned::~pinned() {
  if (p_ != nullptr && cudaHostUnregister(p_) != cudaSuccess) (void)cudaGetLastError();
}

std::string cublas_version() {
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS) {
    return "cuBLAS (version unknown)";
  }
  return "cuBLAS " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace fashion_mnist::gpu
