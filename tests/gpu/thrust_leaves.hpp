// SPDX-License-Identifier: Apache-2.0
#pragma once
// What tests/gpu/thrust_leaves.cu (compiled by nvcc) hands the Catch2 test (compiled by g++):
// host copies of what its thrust::device_vector leaves held.
#include <vector>

namespace mirror::test {

struct thrust_leaf_results {
  std::vector<std::vector<float>> own;     // each replica's leaf after its kernel, in replica order
  std::vector<std::vector<float>> synced;  // each replica's ctx.all_reduce(sum) of it
  std::vector<float> reduced;              // Strategy::reduce(max) of the PerReplica leaves
  std::vector<int> ids;                    // the tuple's other column: the replica ids
};

/// `replicas` logical replicas on GPU 0 (ReductionToOneDevice): replica r fills a
/// device_vector of n elements with r + 1 and scales it by 2 with a kernel on its stream.
thrust_leaf_results thrust_leaf_all_reduce(int replicas, std::size_t n);

}  // namespace mirror::test
