// SPDX-License-Identifier: Apache-2.0
#pragma once
// How many cores this process may run on: what decides whether the pool's waits spin.

#include <mirror/detail/lean_std.hpp>  // std::max without <algorithm>
#include <thread>
#if defined(__linux__)
#include <sched.h>
#endif

namespace mirror::threads {

/// The CPUs in this process's affinity mask (`taskset`, a container's cpuset, `mpirun
/// --bind-to core`, SLURM's binding), at least 1. `std::thread::hardware_concurrency()` counts
/// every online CPU instead: a pool pinned to 1 of 2 cores would believe 2 replicas each have a
/// core and spin through the other's time slice. CPU quotas (`docker --cpus`) are not masks and
/// are not seen. Elsewhere than Linux: `hardware_concurrency()`.
inline unsigned usable_cores() noexcept {
#if defined(__linux__)
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    const int n = CPU_COUNT(&mask);
    if (n > 0) return static_cast<unsigned>(n);
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace mirror::threads
