// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ValueContext`: what `distribute_values_from_function` tells the value function.

namespace mirror {

/// Passed to the function of `Strategy::distribute_values_from_function`, once per replica
/// (TF's `tf.distribute.experimental.ValueContext`). On a multi-worker strategy the id is global:
/// worker w's local replica r is `w * R + r`, of `W * R` in all.
struct ValueContext {
  int replica_id_in_sync_group = 0;  ///< the replica the value is for, 0 .. num_replicas_in_sync - 1
  int num_replicas_in_sync = 1;      ///< replicas in all (in every worker)
  friend bool operator==(const ValueContext&, const ValueContext&) = default;
};

}  // namespace mirror
