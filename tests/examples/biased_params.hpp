// SPDX-License-Identifier: Apache-2.0
#pragma once
// Parameters for the Fashion-MNIST model tests (model_test.cpp, gpu_steps_test.cpp).
#include <cstdint>
#include "examples/fashion_mnist/model.hpp"

/// He-initialised weights and non-zero biases, so that every bias gradient is exercised.
inline fashion_mnist::Params make_params(std::uint64_t seed) {
  fashion_mnist::Params p = fashion_mnist::init_params(seed);
  fashion_mnist::rng g{seed + 7};
  for (auto* b : {&p.b1, &p.b2, &p.b3}) {
    for (float& x : *b) x = static_cast<float>(0.1 * g.normal());
  }
  return p;
}
