// SPDX-License-Identifier: Apache-2.0
#pragma once
// What both kinds of variable require of their value type T, checked once for both.

#include <mirror/concepts/nest.hpp>
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/nest_walk.hpp>

namespace mirror::detail {

/// The checks MirroredVariable<T> and SyncOnReadVariable<T> make of T; `ok` once they hold (the
/// compiler names the variable class whose instantiation failed).
template <class T>
struct variable_value_checks {
  static_assert(nest<T>, "mirror: a variable's T (MirroredVariable<T>, SyncOnReadVariable<T>) must be a nest "
                         "(mirror/concepts/nest.hpp)");
  static_assert(all_leaves_own<T>(),
                "mirror: a variable's T (MirroredVariable<T>, SyncOnReadVariable<T>): a variable owns its copies; "
                "use owning leaves (std::vector, std::array, mirror::matrix, scalars), not std::span or "
                "mirror::matrix_view");
  // Cross-replica reads and updates of a variable run on the host (value(), assign, the
  // aggregation): GPU memory there would be a host read of device memory
  // (docs/cuda.md#device-values-on-the-host).
  static_assert(!has_device_leaf<T>(),
                "mirror: a variable's T (MirroredVariable<T>, SyncOnReadVariable<T>): variables of device-resident "
                "leaves (mirror::cuda::device_span, thrust::device_vector) are not supported; keep the variable in "
                "host leaves (std::vector: devices::Cuda stages them to each replica's device for collectives) or "
                "keep device state in PerReplica values reduced with ctx.all_reduce");
  static constexpr bool ok = true;
};

}  // namespace mirror::detail
