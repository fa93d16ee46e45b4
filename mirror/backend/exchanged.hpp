// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::backend::exchanged`: what a device runtime's exchange returns, every replica's payload.

#include <cstddef>

namespace mirror::backend {

/// A read-only view of every replica's exchanged payload, in replica order, read in place from
/// the runtime's fixed-stride slots. Valid until the calling replica's next exchange or barrier.
template <class P>
class exchanged {
 public:
  /// The view of `n` payloads, the first at `base`, `stride` bytes apart (for runtimes).
  exchanged(const void* base, std::size_t stride, std::size_t n) noexcept
      : base_(static_cast<const unsigned char*>(base)), stride_(stride), n_(n) {}
  /// Replica `r`'s payload.
  const P& operator[](std::size_t r) const noexcept {
    return *reinterpret_cast<const P*>(base_ + r * stride_);
  }
  /// The number of replicas.
  std::size_t size() const noexcept { return n_; }
  /// Bytes from one replica's payload to the next's.
  std::size_t stride() const noexcept { return stride_; }
  /// The view of a member at byte `offset` of each payload.
  template <class M>
  exchanged<M> member(std::size_t offset) const noexcept {
    return exchanged<M>(base_ + offset, stride_, n_);
  }

 private:
  const unsigned char* base_;
  std::size_t stride_, n_;
};

}  // namespace mirror::backend
