// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::Synced<T>`: a value inside `fn` that is known to be equal on every replica.

#include <mirror/detail/replica_values.hpp>
#include <utility>

namespace mirror {

/// The result of a collective inside `fn` (`ctx.all_reduce`, `ctx.broadcast`, `ctx.merge_call`):
/// the same value on every replica. Returning it from `fn` makes `run` return `Mirrored<T>`
/// instead of `PerReplica<T>`. Only mirror builds one, so the type cannot lie.
///
/// Read it with `*s`, `s.get()` or `s->member`.
template <class T>
class Synced {
 public:
  using value_type = T;  ///< the synchronised value's type
  ///@{
  /// The value (the same on every replica).
  const T& get() const& noexcept { return value_; }
  T& get() & noexcept { return value_; }
  T&& get() && noexcept { return std::move(value_); }
  const T& operator*() const& noexcept { return value_; }
  T& operator*() & noexcept { return value_; }
  T&& operator*() && noexcept { return std::move(value_); }
  ///@}
  ///@{
  /// Member access to the value: `s->weights`.
  const T* operator->() const noexcept { return &value_; }
  T* operator->() noexcept { return &value_; }
  ///@}

 private:
  explicit Synced(T value) : value_(std::move(value)) {}
  T value_;
  friend struct detail::access;
};

}  // namespace mirror
