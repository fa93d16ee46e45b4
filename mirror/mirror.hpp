// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Everything: the core and every backend enabled in this build. Includes only. Also brings
/// Hana's struct macros (BOOST_HANA_DEFINE_STRUCT, BOOST_HANA_ADAPT_STRUCT), so a nest can be
/// declared with this header alone.

#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/define_struct.hpp>

#include <mirror/axis.hpp>
#include <mirror/checkpoint.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/concepts/nest.hpp>
#include <mirror/config.hpp>
#include <mirror/cut_for_replica.hpp>
#include <mirror/default_device.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/distributed_dataset.hpp>
#include <mirror/error.hpp>
#include <mirror/flight_recorder.hpp>
#include <mirror/input_context.hpp>
#include <mirror/leaf_traits.hpp>
#include <mirror/matrix.hpp>
#include <mirror/mirrored.hpp>
#include <mirror/mirrored_variable.hpp>
#include <mirror/ops/hierarchical_copy.hpp>
#include <mirror/ops/reduction_to_one_device.hpp>
#include <mirror/per_replica.hpp>
#include <mirror/reduce_op.hpp>
#include <mirror/replica_context.hpp>
#include <mirror/shard.hpp>
#include <mirror/strategy.hpp>
#include <mirror/sync_on_read_variable.hpp>
#include <mirror/synced.hpp>
#include <mirror/value_context.hpp>
#include <mirror/variable_aggregation.hpp>

#include <mirror/backends/threads/threads.hpp>
#if MIRROR_HAS_CUDA
#include <mirror/backends/cuda/cuda.hpp>  // and, in NCCL builds, backends/nccl (through cuda_device.hpp)
#endif
#if MIRROR_HAS_MPI
#include <mirror/backends/mpi/mpi.hpp>  // devices::Cluster, ops::Hierarchical, ops::MpiAllReduce (no <mpi.h>: libmirror_mpi has it)
#endif
