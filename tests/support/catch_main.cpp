// SPDX-License-Identifier: Apache-2.0
// The one Catch2 main, compiled once and linked into every test executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

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
