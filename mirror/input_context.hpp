// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::InputContext`: what `distribute_datasets_from_function` tells the dataset function.

#include <stdexcept>
#include <mirror/detail/format.hpp>

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
      throw std::invalid_argument(detail::format("mirror::InputContext::get_per_replica_batch_size(%d): the global "
                                                 "batch size is not divisible by num_replicas_in_sync = %d; pick a "
                                                 "multiple of it",
                                                 global_batch_size, num_replicas_in_sync)
                                      .c_str());
    }
    return global_batch_size / num_replicas_in_sync;
  }
  friend bool operator==(const InputContext&, const InputContext&) = default;
};

}  // namespace mirror
