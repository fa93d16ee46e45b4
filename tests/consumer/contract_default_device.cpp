// SPDX-License-Identifier: Apache-2.0
// A program written only against the public contract (docs/design.md#the-public-contract) that uses
// the *default* device, built outside the tree with `pkg-config --cflags --libs mirror`
// (run_consumer.sh) and as a Meson subproject. In CUDA builds `devices::Default` is
// `devices::Cuda`, whose runtime lives in the installed libmirror_cuda (and, with NCCL,
// libmirror_nccl): this program odr-uses it, so it only links when mirror.pc names those libraries
// and the CUDA runtime. Without a GPU (CI) the CUDA strategy cannot start; the program then checks
// that the failure is the documented `mirror::backend_error` and runs the same contract on the CPU
// fallback. Exit code 0 means every check held.
#include <mirror/mirror.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

namespace {
int failures = 0, checks = 0;
void check(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

// The contract on whichever strategy we got: sums over replicas, through fn and reduce.
template <class S>
void exercise(S& s, const char* name) {
  const int n = s.num_replicas_in_sync();
  auto ids = s.run([](auto& ctx) { return std::vector<float>{float(ctx.replica_id_in_sync_group()), 1.0f}; });
  const auto sum = s.reduce(mirror::ReduceOp::sum, ids);
  check(sum == std::vector<float>{float(n * (n - 1) / 2), float(n)}, std::string(name) + ": reduce(sum) of ids");
  auto synced = s.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::max, ctx.replica_id_in_sync_group()); });
  for (const int v : synced) check(v == n - 1, std::string(name) + ": all_reduce(max) of ids");
  // A checkpoint round trip: mirror::save and mirror::restore need zlib (crc32), which the
  // consumer gets from mirror.pc or the CMake package, not by naming it.
  auto v = s.make_variable(std::vector<float>{1.5f, -2.0f}, mirror::VariableAggregation::mean);
  const auto path = std::filesystem::temp_directory_path() / ("mirror_contract_default_device_" + std::to_string(n) + ".ckpt");
  mirror::save(s, path, v);
  v.assign(std::vector<float>{0.f, 0.f});
  mirror::restore(s, path, v);
  check(v.value() == std::vector<float>{1.5f, -2.0f}, std::string(name) + ": save / restore");
  std::filesystem::remove(path);
}
}  // namespace

int main() {
  static_assert(std::is_same_v<mirror::Strategy<>::device_type, mirror::devices::Default>);
#if MIRROR_HAS_CUDA
  static_assert(std::is_same_v<mirror::devices::Default, mirror::devices::Cuda>,
                "architecture.md 2: CUDA builds default to devices::Cuda");
  if (mirror::cuda::device_count() > 0) {
    mirror::Strategy<> s;  // every visible GPU
    exercise(s, "Strategy<> on CUDA");
  } else {
    try {
      mirror::Strategy<> s;
      check(false, "Strategy<devices::Cuda> without a GPU must throw mirror::backend_error");
    } catch (const mirror::backend_error&) {
      check(true, "Strategy<devices::Cuda> without a GPU throws mirror::backend_error");
    }
    std::printf("no CUDA device: checked the error path; the CUDA run itself needs a GPU\n");
  }
  // The documented fallback: CUDA when there is a GPU, the CPU otherwise.
  mirror::cuda::with_available_device([](auto& s) { exercise(s, "with_available_device"); },
                                      mirror::devices::Cuda{}, mirror::devices::Threads{.replicas = 3});
#else
  mirror::Strategy<> s{mirror::devices::Threads{.replicas = 3}};
  exercise(s, "Strategy<> on threads");
#endif
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
