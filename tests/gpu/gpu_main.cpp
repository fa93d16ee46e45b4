// SPDX-License-Identifier: Apache-2.0
// main() of the GPU suite: without a CUDA device it prints a SKIP line and exits 77, which
// `meson test` reports as SKIP; with one it runs Catch2.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <mirror/mirror.hpp>

int main(int argc, char* argv[]) {
  if (mirror::cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device (mirror::cuda::device_count() == 0); the GPU suite needs an NVIDIA GPU\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
