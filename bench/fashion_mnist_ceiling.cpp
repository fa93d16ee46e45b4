// SPDX-License-Identifier: Apache-2.0
// The ceiling of the Fashion-MNIST trainer's scaling on this machine: the model's forward and
// backward pass alone (examples/fashion_mnist/model.hpp, the same OpenBLAS, one thread each; no
// collective, no optimiser, no input pipeline) on a 256-row batch on one thread, against two
// threads doing 128 rows each at the same time with a barrier per step, as 2 replicas would.
// A data-parallel trainer cannot scale better than its compute does: this is what bounds
// bench/fashion_mnist_scaling.sh's speedup, measured beside it.
//
//   fashion_mnist_ceiling [--rounds 5] [--steps 300]
//
// Each round times both, alternately; prints each round's ratio, then one line
// "ceiling <median ratio>" (ms/step: medians).
#include <dlfcn.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>
#include "../examples/fashion_mnist/model.hpp"
#include "median.hpp"

namespace fm = fashion_mnist;

namespace {

constexpr std::size_t batch = 256;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, steps = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view a = argv[i];
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
  }
  if (rounds < 1 || steps < 1) {
    std::fprintf(stderr, "usage: fashion_mnist_ceiling [--rounds N >= 1] [--steps N >= 1]\n");
    return 2;
  }
  // One OpenBLAS thread per replica, as the trainer sets it (a BLAS without the call: as it is).
  if (const auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_threads(1);
  }
  const fm::Params params = fm::init_params(1);
  std::vector<std::uint8_t> pixels(batch * fm::in_features);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 131 % 251);
  std::vector<std::int32_t> labels(batch);
  for (std::size_t i = 0; i < batch; ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  const auto rows = [&](std::size_t first, std::size_t n) {
    return mirror::matrix_view<const std::uint8_t>{
        std::span<const std::uint8_t>(pixels).subspan(first * fm::in_features, n * fm::in_features), fm::in_features};
  };

  const auto one_thread = [&] {
    fm::Workspace w(batch);
    std::vector<float> losses(batch), correct(batch);
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) w.forward_backward(params, rows(0, batch), labels, batch, losses, correct);
    return seconds_since(t0) / steps;
  };
  const auto two_threads = [&] {
    std::barrier sync(2);
    double t = 0;
    const auto replica = [&](std::size_t r) {
      const std::size_t n = batch / 2;
      fm::Workspace w(n);
      std::vector<float> losses(n), correct(n);
      const std::span<const std::int32_t> mine(labels.data() + r * n, n);
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        w.forward_backward(params, rows(r * n, n), mine, batch, losses, correct);
        sync.arrive_and_wait();
      }
      if (r == 0) t = seconds_since(t0) / steps;
    };
    std::thread other(replica, std::size_t{1});
    replica(0);
    other.join();
    return t;
  };

  std::vector<double> one, two, ratio;
  for (int i = 0; i < rounds; ++i) {
    one.push_back(one_thread());
    two.push_back(two_threads());
    ratio.push_back(one.back() / two.back());
    std::printf("round %d: 1 thread x 256 rows %.3f ms/step, 2 threads x 128 rows %.3f ms/step, ratio %.2f\n", i + 1,
                one.back() * 1e3, two.back() * 1e3, ratio.back());
  }
  std::printf("1 thread x 256 rows %.3f ms/step, 2 threads x 128 rows %.3f ms/step (medians)\n", median(one) * 1e3,
              median(two) * 1e3);
  std::printf("ceiling %.2f\n", median(ratio));
  return 0;
}
