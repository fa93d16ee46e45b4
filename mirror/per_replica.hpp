// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::PerReplica<T>`: one possibly different value per replica.

#include <cstddef>
#include <mirror/detail/replica_values.hpp>
#include <utility>
#include <vector>

namespace mirror {

/// One value of type `T` per replica, in replica order: what `Strategy::run` returns when `fn`
/// returns a plain `T`. Nothing says the components agree; `Strategy::reduce` combines them.
///
/// A random-access range of its components (`size()`, `operator[]`, `begin()`, `end()`).
/// Passed to `run`, replica `i` receives component `i` (as `T&` when the `PerReplica` is a
/// non-const lvalue, else `const T&`).
///
/// **Example**: `mirror::PerReplica<int> ids = strategy.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });`
template <class T>
class PerReplica : public detail::replica_values<T> {
 public:
  /// Builds a value from its components, one per replica, in replica order. `run` checks that
  /// the count equals `num_replicas_in_sync()`.
  explicit PerReplica(std::vector<T> components)
      : detail::replica_values<T>(detail::replica_storage<T>(std::move(components))) {}

  /// Mutable access to component `i`, used when a non-const `PerReplica` is passed to `run`.
  T& operator[](std::size_t i) noexcept { return this->values_.data()[i]; }
  using detail::replica_values<T>::operator[];

 private:
  PerReplica(detail::adopt_storage_t, detail::replica_storage<T> components) noexcept
      : detail::replica_values<T>(std::move(components)) {}
  friend struct detail::access;
};

}  // namespace mirror
