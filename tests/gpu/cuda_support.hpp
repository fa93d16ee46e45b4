// SPDX-License-Identifier: Apache-2.0
#pragma once
// mirror::test::make_device for devices::Cuda: R replicas on R GPUs when there are that many,
// otherwise R logical devices on GPU 0 (TF's virtual GPUs), so every count runs on one GPU.
#include <chrono>
#include <mirror/mirror.hpp>
#include "support/reference.hpp"

namespace mirror::test {

template <>
inline devices::Cuda make_device<devices::Cuda>(int replicas) {
  devices::Cuda d{};
  if (replicas <= cuda::device_count()) {
    for (int g = 0; g < replicas; ++g) d.gpus.push_back(g);
  } else {
    d.gpus = {0};
    d.replicas_per_gpu = replicas;
  }
  d.timeout = std::chrono::seconds(60);
  return d;
}

}  // namespace mirror::test
