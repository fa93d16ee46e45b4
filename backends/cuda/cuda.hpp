// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The CUDA backend: `devices::Cuda`, device leaves (`cuda::device_span`, `cuda::device_buffer`),
/// and the CPU fallback `cuda::with_available_device`. In NCCL builds `cuda_device.hpp` also
/// brings `ops::NcclAllReduce`. `thrust::device_vector` leaves: include
/// `<mirror/backends/cuda/thrust_leaves.cuh>` in a file compiled by nvcc.

#include <mirror/backends/cuda/cuda_device.hpp>
#include <mirror/backends/cuda/cuda_runtime.hpp>
#include <mirror/backends/cuda/device_buffer.hpp>
#include <mirror/backends/cuda/device_ptr.hpp>
#include <mirror/backends/cuda/device_span.hpp>
#include <mirror/backends/cuda/element_type.hpp>
#include <mirror/backends/cuda/with_available_device.hpp>
