// SPDX-License-Identifier: Apache-2.0
// The conformance suites (tests/conformance/all_reduce_suite.hpp, gather_scatter_suite.hpp) for mirror::devices::Threads with mirror::ops::HierarchicalCopy{.num_packs = 3}.
#define CONFORMANCE_DEVICE mirror::devices::Threads
#define CONFORMANCE_OPS mirror::ops::HierarchicalCopy{.num_packs = 3}
#define CONFORMANCE_TAG "[threads][hierarchical_copy]"

#include "conformance/all_reduce_suite.hpp"
#include "conformance/gather_scatter_suite.hpp"
