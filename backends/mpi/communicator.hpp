// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::mpi::communicator`: an `MPI_Comm` carried without <mpi.h>, so that the MPI backend's
/// headers (and <mirror/mirror.hpp> in MPI builds) compile without MPI's include path; only
/// libmirror_mpi looks inside.

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mirror::mpi {

/// `MPI_COMM_WORLD` by default; otherwise any `MPI_Comm` (`.comm = my_comm`), stored by value.
/// (An `MPI_Comm` is a handle: a pointer in Open MPI, an int in MPICH.)
class communicator {
 public:
  /// MPI_COMM_WORLD.
  constexpr communicator() noexcept = default;

  /// Wraps an `MPI_Comm`.
  template <class Comm>
    requires(!std::is_same_v<Comm, communicator> && std::is_trivially_copyable_v<Comm> &&
             (std::is_pointer_v<Comm> || std::is_integral_v<Comm>) && sizeof(Comm) <= sizeof(std::uint64_t))
  communicator(Comm comm) noexcept : world_(false), size_(sizeof(Comm)) {  // NOLINT: implicit on purpose
    std::memcpy(&bits_, &comm, sizeof(Comm));
  }

  /// True for the default (MPI_COMM_WORLD).
  constexpr bool is_world() const noexcept { return world_; }

  /// The wrapped `MPI_Comm` (for libmirror_mpi). **Requires**: `!is_world()`, Comm the type
  /// it was made from.
  template <class Comm>
  Comm get() const noexcept {
    Comm c{};
    std::memcpy(&c, &bits_, sizeof(Comm) < size_ ? sizeof(Comm) : size_);
    return c;
  }

  friend bool operator==(const communicator&, const communicator&) = default;

 private:
  bool world_ = true;
  std::uint8_t size_ = 0;
  std::uint64_t bits_ = 0;
};

}  // namespace mirror::mpi
