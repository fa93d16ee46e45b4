// SPDX-License-Identifier: Apache-2.0
// Linked whole into every GPU suite executable: without a CUDA device, tests/support/catch_main.cpp
// prints this reason in a SKIP line and exits 77, which `meson test` reports as SKIP.
#include <mirror/backends/cuda/cuda_runtime.hpp>

extern "C" const char* mirror_test_skip_reason() {
  if (mirror::cuda::device_count() == 0) {
    return "no CUDA device (mirror::cuda::device_count() == 0); the GPU suite needs an NVIDIA GPU";
  }
  return nullptr;
}
