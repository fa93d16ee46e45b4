// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The threads backend: `devices::Threads` and its default ops, `ops::ChunkOwnerAllReduce`.

#include <mirror/backends/threads/chunk_owner_all_reduce.hpp>
#include <mirror/backends/threads/threads_device.hpp>
