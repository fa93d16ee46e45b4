// SPDX-License-Identifier: Apache-2.0
// The conformance suites (tests/conformance/all_reduce_suite.hpp, gather_scatter_suite.hpp) for
// mirror::devices::Threads with the ops policy of examples/custom_ops/, which is written against
// the public backend API alone (docs/backend.md).
#define CONFORMANCE_DEVICE mirror::devices::Threads
#define CONFORMANCE_OPS example::SliceOwnerAllReduce{}
#define CONFORMANCE_TAG "[threads][custom_ops]"
#include "../../examples/custom_ops/slice_owner_all_reduce.hpp"
#include "conformance/all_reduce_suite.hpp"
#include "conformance/gather_scatter_suite.hpp"
