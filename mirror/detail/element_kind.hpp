// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one run-time tag of an element type: what the compiled backends (MPI datatypes, CUDA kernel
// dispatch, NCCL datatypes), the cross-worker agreement check and checkpoints see of a leaf's
// element type once the type itself is gone. Its category and size in bytes say everything they
// need; code() is its value on the wire and in checkpoint files, so it never changes.

#include <cstdint>
#include <type_traits>
#include <mirror/detail/format.hpp>

namespace mirror::detail {

struct element_kind {
  /// IEEE binary floating point, two's-complement integers, and bfloat16 (2 bytes, like IEEE
  /// binary16, and different from it).
  enum class category : std::uint8_t { floating, signed_integer, unsigned_integer, bfloat };
  category cat;        ///< what the bits mean
  std::uint8_t bytes;  ///< sizeof the element

  /// "float", "bfloat", "int" or "uint": with 8 * bytes, the kind's name in messages (float32).
  constexpr const char* category_name() const noexcept {
    return cat == category::floating         ? "float"
           : cat == category::bfloat         ? "bfloat"
           : cat == category::signed_integer ? "int"
                                             : "uint";
  }
  constexpr bool is_floating() const noexcept { return cat == category::floating || cat == category::bfloat; }
  /// The category in the upper byte, the size in the lower one.
  constexpr std::uint16_t code() const noexcept {
    return static_cast<std::uint16_t>(static_cast<unsigned>(cat) << 8 | bytes);
  }
  static constexpr element_kind from_code(std::uint64_t code) noexcept {
    return {static_cast<category>((code >> 8) & 0xff), static_cast<std::uint8_t>(code & 0xff)};
  }
  friend constexpr bool operator==(const element_kind&, const element_kind&) = default;
};

/// How messages name a kind: "float32", "int8", "bfloat16".
inline message kind_name(element_kind k) { return format("%s%d", k.category_name(), 8 * k.bytes); }

/// The kind of E. Defined here for the arithmetic types; a backend with storage-only element
/// types of its own (the CUDA backend's half and bfloat16) specialises it next to them.
template <class E>
struct element_kind_traits {};

template <class E>
  requires std::is_arithmetic_v<E>
struct element_kind_traits<E> {
  static constexpr element_kind value{std::is_floating_point_v<E> ? element_kind::category::floating
                                      : std::is_signed_v<E>       ? element_kind::category::signed_integer
                                                                  : element_kind::category::unsigned_integer,
                                      static_cast<std::uint8_t>(sizeof(E))};
};

template <class E>
constexpr element_kind element_kind_of() noexcept {
  static_assert(requires { element_kind_traits<std::remove_cv_t<E>>::value; },
                "mirror: this element type has no element kind; leaves hold arithmetic elements (or a backend's own "
                "storage types, such as mirror::cuda::half)");
  return element_kind_traits<std::remove_cv_t<E>>::value;
}

}  // namespace mirror::detail
