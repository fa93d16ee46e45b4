// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to libmirror_mpi (not installed): the one message of every agreement check, and the
// MPI reductions that combine it (group/agreement_slot.cpp). A small all-reduce's data rides in
// the same message, so that it costs one collective instead of two (group/collectives.cpp).

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <mirror/detail/element_kind.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::mpi::support {

/// What every worker sends in an agreement check: {key, -key}, combined with MAX (the keys were
/// equal on every worker exactly when key == -(-key) afterwards), then up to `payload` bytes of
/// an all-reduce's elements, combined with its op. Every check sends one whole slot, carrying data
/// or not: workers that disagree must still post matching collectives, and MPI would report
/// messages of different sizes as a truncation error on some workers only.
struct agreement_slot {
  std::int64_t key[2];
  alignas(16) unsigned char payload[112];
};
static_assert(sizeof(agreement_slot) == 128);
inline constexpr std::size_t slot_payload_bytes = sizeof(agreement_slot::payload);

/// `inout` becomes `in` combined with `inout`: the keys under MAX, and the payload's elements as
/// the MPI reduction op_of would combine them (`inout = in op inout`, as MPI_Reduce_local).
using slot_combiner = void (*)(const agreement_slot& in, agreement_slot& inout) noexcept;

/// The combiner of slots whose payload holds elements of `kind` under `op` (`mean`: summed);
/// keys only where `carried` is false. `kind` must be a host arithmetic kind MPI has
/// (datatype_of: not bfloat).
slot_combiner agreement_combiner(bool carried, detail::element_kind kind, ReduceOp op) noexcept;

/// Makes the datatype and the reductions below; once per process, after MPI_Init.
void make_agreement_ops();

/// One slot as an MPI datatype (contiguous bytes: MPI never splits an element across a reduction).
MPI_Datatype agreement_type() noexcept;

/// agreement_combiner as an MPI op, for MPI_Iallreduce of agreement_type().
MPI_Op agreement_op(bool carried, detail::element_kind kind, ReduceOp op) noexcept;

}  // namespace mirror::mpi::support
