// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::default_ops_t<Device>`: the fastest correct cross-device ops for a device.

#include <mirror/ops/reduction_to_one_device.hpp>

namespace mirror {

/// Maps a device policy to its default ops policy. A backend specialises it for its device
/// (`devices::Threads` → `ops::ChunkOwnerAllReduce`); any other device gets
/// `ops::ReductionToOneDevice`, which works wherever the device can copy.
template <class Device>
struct default_ops {
  using type = ops::ReductionToOneDevice;  ///< the ops policy
};

/// The default cross-device ops policy for `Device`.
template <class Device>
using default_ops_t = typename default_ops<Device>::type;

}  // namespace mirror
