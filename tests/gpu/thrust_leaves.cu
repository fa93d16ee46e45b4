// SPDX-License-Identifier: Apache-2.0
// A user's kernel file: nvcc compiles <mirror/mirror.hpp> with <mirror/backends/cuda/thrust_leaves.cuh>,
// launches a kernel on the replica's stream and all-reduces a thrust::device_vector leaf. Built
// in CI (it is what failed to compile with nvcc 13 before: mirror's concept checks and run's
// tuple results), run on a GPU by tests/gpu/cuda_device_test.cpp.
#include <mirror/mirror.hpp>
#include <mirror/backends/cuda/thrust_leaves.cuh>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <cuda_runtime.h>
#include <tuple>
#include "thrust_leaves.hpp"

namespace mirror::test {
namespace {

__global__ void scale(float* x, std::size_t n, float by) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] *= by;
  }
}

std::vector<float> to_host(const thrust::device_vector<float>& v) {
  thrust::host_vector<float> h = v;  // a copy on the legacy default stream, ordered after the replicas' streams
  return {h.begin(), h.end()};
}

}  // namespace

thrust_leaf_results thrust_leaf_all_reduce(int replicas, std::size_t n) {
  Strategy<devices::Cuda, ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = replicas}};
  static_assert(device<devices::Cuda> && cross_device_ops<ops::ReductionToOneDevice, devices::Cuda>);
  // A tuple result: run lifts it column by column (PerReplica, Mirrored, PerReplica).
  auto [own, synced, ids] = s.run([n](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    thrust::device_vector<float> v(n, float(r + 1));
    auto stream = static_cast<cudaStream_t>(cuda::current_stream());
    scale<<<64, 256, 0, stream>>>(thrust::raw_pointer_cast(v.data()), v.size(), 2.0f);
    if (cudaGetLastError() != cudaSuccess) throw error("the scale kernel did not launch");
    auto sum = ctx.all_reduce(ReduceOp::sum, v);
    return std::tuple{std::move(v), std::move(sum), r};
  });
  thrust_leaf_results out;
  out.reduced = to_host(s.reduce(ReduceOp::max, own));
  for (int r = 0; r < replicas; ++r) s.runtime().synchronize(r);
  for (const auto& v : own) out.own.push_back(to_host(v));
  for (const auto& v : synced) out.synced.push_back(to_host(v));
  for (const int id : ids) out.ids.push_back(id);
  return out;
}

}  // namespace mirror::test
