// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The MPI backend (multi-worker): `devices::Cluster<Local>`, `ops::Hierarchical`,
/// `ops::MpiAllReduce`, and `mpi::survivors` (going on after a worker dies; the loop that does it
/// for you, `mirror::elastic`, is <mirror/backends/mpi/elastic.hpp>). Includes no MPI header
/// (only libmirror_mpi does): link libmirror_mpi and MPI (`pkg-config --libs mirror` does, in
/// MPI builds).

#include <mirror/backends/mpi/cluster_device.hpp>
#include <mirror/backends/mpi/communicator.hpp>
#include <mirror/backends/mpi/hierarchical.hpp>
#include <mirror/backends/mpi/mpi_all_reduce.hpp>
#include <mirror/backends/mpi/mpi_group.hpp>
#include <mirror/backends/mpi/survivors.hpp>
#include <mirror/backends/threads/threads.hpp>
