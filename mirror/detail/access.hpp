// SPDX-License-Identifier: Apache-2.0
#pragma once
// detail::access builds the values whose constructors are private to users (Mirrored, Synced).

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
