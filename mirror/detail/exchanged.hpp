// SPDX-License-Identifier: Apache-2.0
#pragma once
// The result of a device runtime's exchange: every replica's payload, read in place from the
// runtime's fixed-stride slots.

#include <cstddef>

namespace mirror::detail {

/// A read-only view of every replica's exchanged payload, in replica order. Valid until the
/// calling replica's next exchange or barrier.
template <class P>
class exchanged {
 public:
  exchanged(const void* base, std::size_t stride, std::size_t n) noexcept
      : base_(static_cast<const unsigned char*>(base)), stride_(stride), n_(n) {}
  const P& operator[](std::size_t r) const noexcept {
    return *reinterpret_cast<const P*>(base_ + r * stride_);
  }
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

}  // namespace mirror::detail
