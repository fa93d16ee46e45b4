// SPDX-License-Identifier: Apache-2.0
// The conformance suites for mirror::test::FakeDevice (buffers reachable only by copy) with the
// ops policy of examples/custom_ops/: it needs nothing of a device beyond the device concept's
// primitives (docs/backend.md).
#define CONFORMANCE_DEVICE mirror::test::FakeDevice
#define CONFORMANCE_OPS example::SliceOwnerAllReduce{}
#define CONFORMANCE_TAG "[fake][custom_ops]"
#include "support/fake_device.hpp"
#include "../../examples/custom_ops/slice_owner_all_reduce.hpp"
#include "conformance/all_reduce_suite.hpp"
#include "conformance/gather_scatter_suite.hpp"
