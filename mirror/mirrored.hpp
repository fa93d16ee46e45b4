// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::Mirrored<T>`: one value per replica, known to be the same everywhere.

#include <mirror/detail/replica_values.hpp>
#include <utility>
#include <vector>

namespace mirror {

/// One copy of a synchronised value per replica. Only mirror builds it — from a `Synced<T>`
/// returned by `fn` (`ctx.all_reduce`, `ctx.broadcast`, `ctx.merge_call`) or from
/// `Strategy::broadcast` — so holding a `Mirrored<T>` means the copies agree.
///
/// A random-access range of the copies, plus `primary()` (the copy of replica 0). Passed to `run`,
/// replica `i` receives its own copy as `const T&`. `reduce(op, mirrored)` treats the copies as
/// `PerReplica` values: a `sum` is N times the value.
template <class T>
class Mirrored : public detail::replica_values<T> {
 public:
  /// The copy held by replica 0.
  const T& primary() const noexcept { return this->values_.data()[0]; }

 private:
  Mirrored(detail::adopt_storage_t, detail::replica_storage<T> copies) noexcept
      : detail::replica_values<T>(std::move(copies)) {}
  friend struct detail::access;
};

}  // namespace mirror
