// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The NCCL backend: `ops::NcclAllReduce`, the default ops of `devices::Cuda` in NCCL builds.

#include <mirror/backends/nccl/nccl_all_reduce.hpp>
