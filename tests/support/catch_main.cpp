// SPDX-License-Identifier: Apache-2.0
// The one Catch2 main, compiled once (without optimisation: Catch2's implementation is ~3/4 of a
// test build's CPU time at -O2 and nothing in it is hot) and linked into every test executable.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <string_view>

#include <cstdio>

#if defined(__GLIBC__)
#include <malloc.h>
// The conformance suites allocate and free hundreds of megabytes of vectors. With glibc's
// default thresholds every multi-megabyte vector is a fresh mmap whose pages fault in again:
// 2.9 million minor faults and 9 s of system time in one suite (measured with /usr/bin/time -v).
// Keeping freed memory in the heap makes the suites CPU-bound. (No effect under sanitizers,
// which bring their own allocator.)
static const int keep_freed_memory = [] {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return 0;
}();
#endif

// Hooks for suites with special needs, weak so that other executables need not define them.
// A suite that needs hardware (tests/gpu/skip_without_gpu.cpp) returns a reason to skip, or
// nullptr to run.
extern "C" const char* mirror_test_skip_reason() __attribute__((weak));
// A suite whose processes need setup around the session (tests/mpi/mpi_main.cpp: MPI_Init, one
// report per job) calls run_session with the arguments to use and returns main's exit status.
extern "C" int mirror_test_main(int argc, char** argv, int (*run_session)(int, const char* const*))
    __attribute__((weak));

namespace {
int run_session(int argc, const char* const* argv) { return Catch::Session().run(argc, argv); }

// Listing the test cases needs no hardware: the GPU kit checks its test filters on any machine.
bool only_lists(int argc, char* argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--list") || a == "-l" || a == "-t") return true;
  }
  return false;
}
}  // namespace

int main(int argc, char* argv[]) {
  if (mirror_test_skip_reason != nullptr && !only_lists(argc, argv)) {
    if (const char* why = mirror_test_skip_reason()) {
      std::printf("SKIP: %s\n", why);
      return 77;  // meson test reports SKIP
    }
  }
  if (mirror_test_main != nullptr) return mirror_test_main(argc, argv, run_session);
  return run_session(argc, argv);
}
