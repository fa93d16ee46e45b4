// SPDX-License-Identifier: Apache-2.0
// The conformance suite (tests/conformance/all_reduce_suite.hpp) for mirror::devices::Threads with mirror::ops::ChunkOwnerAllReduce{}.
#define CONFORMANCE_DEVICE mirror::devices::Threads
#define CONFORMANCE_OPS mirror::ops::ChunkOwnerAllReduce{}
#define CONFORMANCE_TAG "[threads][chunk_owner]"

#include "conformance/all_reduce_suite.hpp"
