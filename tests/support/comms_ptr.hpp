// SPDX-License-Identifier: Apache-2.0
#pragma once
// The communicators of backends/nccl/nccl_comms.cpp for a test that calls it directly (against
// the scripted NCCL of fake_nccl.cpp): created on `devices`, destroyed with the test's scope.
#include <chrono>
#include <span>
#include <vector>
#include <mirror/backends/nccl/nccl_comms.hpp>

namespace mirror::test {

/// nccl::impl::create_comms on `devices`, and nccl::impl::destroy when it goes.
struct comms_ptr {
  nccl::impl::comms* c;  ///< the set
  /// Creates the set (local rank i on devices[i]), waiting up to `timeout` for every rank.
  explicit comms_ptr(std::vector<int> devices, std::chrono::milliseconds timeout = std::chrono::seconds(5))
      : c(nccl::impl::create_comms(std::span<const int>(devices.data(), devices.size()), timeout)) {}
  comms_ptr(const comms_ptr&) = delete;
  comms_ptr& operator=(const comms_ptr&) = delete;
  ~comms_ptr() { nccl::impl::destroy(c); }
  /// The set.
  nccl::impl::comms& operator*() const { return *c; }
};

}  // namespace mirror::test
