// SPDX-License-Identifier: Apache-2.0
// The conformance suites (tests/conformance/all_reduce_suite.hpp, gather_scatter_suite.hpp) for mirror::devices::Cuda with mirror::ops::HierarchicalCopy{.num_packs = 3}.
#include "gpu/cuda_support.hpp"
#define CONFORMANCE_DEVICE mirror::devices::Cuda
#define CONFORMANCE_OPS mirror::ops::HierarchicalCopy{.num_packs = 3}
#define CONFORMANCE_TAG "[cuda][hierarchical_copy]"

#include "conformance/all_reduce_suite.hpp"
#include "conformance/gather_scatter_suite.hpp"
