// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cuda::device_ptr<E>`: the `pointer<E>` of the CUDA runtime — an address in one
/// GPU's memory together with that GPU's ordinal, so copies and kernels know where it lives
/// without asking the driver.

#include <cstddef>

namespace mirror::cuda {

/// A device address and the CUDA device ordinal that owns it (-1: none).
template <class E>
struct device_ptr {
  E* ptr = nullptr;  ///< the device address
  int device = -1;   ///< the CUDA device ordinal (-1: none)

  friend device_ptr operator+(device_ptr p, std::size_t n) noexcept { return {p.ptr + n, p.device}; }
  friend bool operator==(const device_ptr&, const device_ptr&) = default;
};

}  // namespace mirror::cuda
