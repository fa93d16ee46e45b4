// SPDX-License-Identifier: Apache-2.0
#pragma once
// detail::access builds the values whose constructors are private to users (Mirrored, Synced,
// variables) and reaches the members only mirror calls (a variable's per-replica handle).

#include <mirror/mirrored.hpp>
#include <mirror/per_replica.hpp>
#include <mirror/synced.hpp>
#include <utility>
#include <vector>

namespace mirror::detail {

struct access {
  template <class T>
  static Synced<T> synced(T value) { return Synced<T>(std::move(value)); }
  template <class T>
  static Mirrored<T> mirrored(replica_storage<T> copies) noexcept {
    return Mirrored<T>(adopt_storage_t{}, std::move(copies));
  }
  template <class T>
  static PerReplica<T> per_replica(replica_storage<T> components) noexcept {
    return PerReplica<T>(adopt_storage_t{}, std::move(components));
  }
  template <class T>
  static T&& unwrap(Synced<T>&& s) { return std::move(s.value_); }
  /// The replica-local handle of a variable that `run` passes to replica r's fn.
  template <class V, class Context>
  static auto handle_for(V& variable, int r, Context& ctx) noexcept {
    return variable.handle_for(r, ctx);
  }
  /// Calls a constructor that only mirror may call (variables).
  template <class V, class... A>
  static V make(A&&... args) { return V(std::forward<A>(args)...); }
};

template <class T> struct is_synced : std::false_type {};
template <class T> struct is_synced<Synced<T>> : std::true_type {};
template <class T> struct is_per_replica : std::false_type {};
template <class T> struct is_per_replica<PerReplica<T>> : std::true_type {};
template <class T> struct is_mirrored : std::false_type {};
template <class T> struct is_mirrored<Mirrored<T>> : std::true_type {};

}  // namespace mirror::detail
