// SPDX-License-Identifier: Apache-2.0
// The conformance suites (tests/conformance/all_reduce_suite.hpp, gather_scatter_suite.hpp) for mirror::test::FakeDevice with mirror::ops::HierarchicalCopy{.num_packs = 0}.
#define CONFORMANCE_DEVICE mirror::test::FakeDevice
#define CONFORMANCE_OPS mirror::ops::HierarchicalCopy{.num_packs = 0}
#define CONFORMANCE_TAG "[fake][hierarchical_copy]"
#include "support/fake_device.hpp"
#include "conformance/all_reduce_suite.hpp"
#include "conformance/gather_scatter_suite.hpp"
