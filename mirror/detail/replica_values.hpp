// SPDX-License-Identifier: Apache-2.0
#pragma once
// The storage and range interface shared by PerReplica<T> and Mirrored<T>.

#include <cstddef>
#include <utility>
#include <vector>

namespace mirror::detail {

struct access;  // the one place allowed to build Mirrored / Synced values

/// One value per replica, in replica order, as a read-only random-access range.
template <class T>
class replica_values {
 public:
  using value_type = T;
  using const_iterator = typename std::vector<T>::const_iterator;
  using iterator = const_iterator;

  /// Number of components (= replicas).
  std::size_t size() const noexcept { return values_.size(); }
  /// Component of replica `i`. Requires `i < size()`.
  const T& operator[](std::size_t i) const noexcept { return values_[i]; }
  const_iterator begin() const noexcept { return values_.begin(); }
  const_iterator end() const noexcept { return values_.end(); }

 protected:
  replica_values() = default;
  explicit replica_values(std::vector<T> values) : values_(std::move(values)) {}
  std::vector<T> values_;
  friend struct access;
};

}  // namespace mirror::detail
