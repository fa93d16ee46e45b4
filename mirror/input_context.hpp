// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::InputContext`: what `distribute_datasets_from_function` tells the dataset function.

#include <stdexcept>
#include <string>

namespace mirror {

/// Passed to the function of `Strategy::distribute_datasets_from_function`, once per input
/// pipeline (one per worker; one in a single process). The function batches per replica and
/// shards its data itself: `get_per_replica_batch_size(global)` gives the batch each replica
/// should dequeue.
struct InputContext {
  int num_input_pipelines = 1;  ///< input pipelines (workers) in all
  int input_pipeline_id = 0;    ///< this pipeline, 0 .. num_input_pipelines - 1
  int num_replicas_in_sync = 1;  ///< replicas in all

  /// `global_batch_size / num_replicas_in_sync`.
  /// **Errors**: `std::invalid_argument` when it does not divide.
  int get_per_replica_batch_size(int global_batch_size) const {
    if (num_replicas_in_sync <= 0 || global_batch_size % num_replicas_in_sync != 0) {
      throw std::invalid_argument("mirror::InputContext::get_per_replica_batch_size(" +
                                  std::to_string(global_batch_size) + "): the global batch size is not divisible by "
                                  "num_replicas_in_sync = " + std::to_string(num_replicas_in_sync) +
                                  "; pick a multiple of it");
    }
    return global_batch_size / num_replicas_in_sync;
  }
  friend bool operator==(const InputContext&, const InputContext&) = default;
};

}  // namespace mirror
