// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::devices::Default`: `Cuda` in builds with the CUDA backend, `Threads` otherwise.
/// Only declared here; `<mirror/mirror.hpp>` brings the backend that defines it.

#include <mirror/config.hpp>

namespace mirror::devices {
#if MIRROR_HAS_CUDA
struct Cuda;
/// The device `Strategy<>` uses when none is named.
using Default = Cuda;
#else
struct Threads;
/// The device `Strategy<>` uses when none is named.
using Default = Threads;
#endif
}  // namespace mirror::devices
