// SPDX-License-Identifier: Apache-2.0
// The agreement check's message and its reductions (agreement_slot.hpp).

#include <mirror/backends/mpi/group/agreement_slot.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <mirror/detail/element_ops.hpp>
#include <mirror/backends/mpi/group/impl.hpp>  // check

namespace mirror::mpi::support {
namespace {

MPI_Datatype slot_type = MPI_DATATYPE_NULL;
// [category: floating, signed, unsigned][log2 of the element's bytes][ReduceOp]; [0][0] keys only.
MPI_Op ops[3][5][5] = {};
slot_combiner combiners[3][5][5] = {};

// inout = in op inout, the payload's elements as detail::combine(op, in, inout): what op_of's
// MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX and floating_extreme compute (integers wrap). Elements are
// copied in and out: Open MPI's scratch buffers promise no alignment beyond malloc's.
template <class E, ReduceOp Op>
void combine_slot(const agreement_slot& a, agreement_slot& b) noexcept {
  b.key[0] = std::max(a.key[0], b.key[0]);
  b.key[1] = std::max(a.key[1], b.key[1]);
  if constexpr (!std::is_void_v<E>) {
    for (std::size_t i = 0; i + sizeof(E) <= slot_payload_bytes; i += sizeof(E)) {
      E x, y;
      std::memcpy(&x, a.payload + i, sizeof x);
      std::memcpy(&y, b.payload + i, sizeof y);
      y = detail::combine(Op, x, y);
      std::memcpy(b.payload + i, &y, sizeof y);
    }
  }
}

template <class E, ReduceOp Op>
void combine_slots(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const agreement_slot*>(in);
  auto* b = static_cast<agreement_slot*>(inout);
  for (int e = 0; e < *len; ++e) combine_slot<E, Op>(a[e], b[e]);
}

constexpr int log2_of(std::size_t bytes) noexcept { return bytes >= 16 ? 4 : bytes >= 8 ? 3 : bytes >= 4 ? 2 : bytes >= 2 ? 1 : 0; }

// The table's entry for `op` on E (mean: the sum's).
template <class E, ReduceOp Op>
void make(int category, int size) {
  check(MPI_Op_create(&combine_slots<E, Op>, 1, &ops[category][size][static_cast<int>(Op)]),
        "MPI_Op_create (agreement check)");
  combiners[category][size][static_cast<int>(Op)] = &combine_slot<E, Op>;
}

template <class E>
void make_row(int category) {
  const int size = log2_of(sizeof(E));
  make<E, ReduceOp::sum>(category, size);
  make<E, ReduceOp::prod>(category, size);
  make<E, ReduceOp::min>(category, size);
  make<E, ReduceOp::max>(category, size);
}

// Where `carried`, `kind` and `op` are in the tables.
struct entry {
  int category, size, op;
};
entry entry_of(bool carried, detail::element_kind kind, ReduceOp op) noexcept {
  if (!carried) return {0, 0, 0};
  using C = detail::element_kind::category;
  const int category = kind.cat == C::floating ? 0 : kind.cat == C::signed_integer ? 1 : 2;
  // (datatype_of: a floating kind that is neither 4 nor 8 bytes is long double)
  const std::size_t bytes =
      kind.cat == C::floating && kind.bytes != 4 && kind.bytes != 8 ? sizeof(long double) : kind.bytes;
  return {category, log2_of(bytes), static_cast<int>(op == ReduceOp::mean ? ReduceOp::sum : op)};
}

}  // namespace

void make_agreement_ops() {
  static std::once_flag made;
  std::call_once(made, [] {
    check(MPI_Type_contiguous(static_cast<int>(sizeof(agreement_slot)), MPI_BYTE, &slot_type),
          "MPI_Type_contiguous (agreement check)");
    check(MPI_Type_commit(&slot_type), "MPI_Type_commit (agreement check)");
    make<void, ReduceOp::sum>(0, 0);  // keys only (no floating kind is 1 byte)
    make_row<float>(0);
    make_row<double>(0);
    make_row<long double>(0);
    make_row<std::int8_t>(1);
    make_row<std::int16_t>(1);
    make_row<std::int32_t>(1);
    make_row<std::int64_t>(1);
    make_row<std::uint8_t>(2);
    make_row<std::uint16_t>(2);
    make_row<std::uint32_t>(2);
    make_row<std::uint64_t>(2);
  });
}

MPI_Datatype agreement_type() noexcept { return slot_type; }

slot_combiner agreement_combiner(bool carried, detail::element_kind kind, ReduceOp op) noexcept {
  const entry e = entry_of(carried, kind, op);
  return combiners[e.category][e.size][e.op];
}

MPI_Op agreement_op(bool carried, detail::element_kind kind, ReduceOp op) noexcept {
  const entry e = entry_of(carried, kind, op);
  return ops[e.category][e.size][e.op];
}

}  // namespace mirror::mpi::support
