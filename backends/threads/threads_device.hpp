// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::devices::Threads`: replicas are threads of one process, sharing host memory.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <thread>
#include <mirror/backends/threads/threads_runtime.hpp>
#include <mirror/concepts/device.hpp>

namespace mirror::devices {

/// The CPU device: `replicas` threads of this process, in a pool created once per `Strategy`
/// (the calling thread is replica 0). Replicas may outnumber cores: waiting spins briefly, then
/// parks, so 16 replicas on 2 cores progress and an idle pool burns no CPU.
///
/// **Example**: `mirror::Strategy<mirror::devices::Threads> s{{.replicas = 4}};`
struct Threads {
  /// Number of replicas; defaults to the number of hardware threads.
  int replicas = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  /// How long a replica waits in a collective for the others before `mirror::timeout_error`.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);

  friend bool operator==(const Threads&, const Threads&) = default;

  /// Owns the pool; built by `Strategy` from this policy.
  struct runtime : threads::runtime {
    /// Starts `d.replicas - 1` threads (`backend_error` when one cannot be started).
    explicit runtime(const Threads& d) : threads::runtime(d.replicas, d.timeout) {}
  };
};

static_assert(device<Threads>);

}  // namespace mirror::devices
