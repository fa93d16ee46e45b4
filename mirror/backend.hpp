// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The public API for writing a cross-device ops policy or a device backend
/// (docs/backend.md): everything an ops policy receives and may call, in namespace
/// `mirror::backend`. Unlike `mirror::detail`, these names are kept stable across minor versions.

#include <mirror/backend/collective.hpp>
#include <mirror/backend/collective_cancelled.hpp>
#include <mirror/backend/cut_of.hpp>
#include <mirror/backend/exchanged.hpp>
#include <mirror/backend/generic_collectives.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/reduce_op.hpp>
