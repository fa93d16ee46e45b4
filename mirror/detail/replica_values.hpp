// SPDX-License-Identifier: Apache-2.0
#pragma once
// The storage and range interface shared by PerReplica<T> and Mirrored<T>.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <utility>
#include <vector>

namespace mirror::detail {

struct access;  // the one place allowed to build Mirrored / Synced values

/// Contiguous storage of one value per replica. std::vector<bool> is not contiguous (its
/// operator[] returns a proxy), so bool gets a plain array: `fn` may well return a bool.
template <class T>
class replica_storage {
 public:
  replica_storage() = default;
  explicit replica_storage(std::vector<T> v) : v_(std::move(v)) {}
  T* data() noexcept { return v_.data(); }
  const T* data() const noexcept { return v_.data(); }
  std::size_t size() const noexcept { return v_.size(); }

 private:
  std::vector<T> v_;
};

template <>
class replica_storage<bool> {
 public:
  replica_storage() = default;
  explicit replica_storage(const std::vector<bool>& v) : n_(v.size()), p_(std::make_unique<bool[]>(v.size())) {
    std::copy(v.begin(), v.end(), p_.get());
  }
  replica_storage(const replica_storage& o) : n_(o.n_), p_(std::make_unique<bool[]>(o.n_)) {
    std::copy(o.p_.get(), o.p_.get() + n_, p_.get());
  }
  replica_storage(replica_storage&&) noexcept = default;
  replica_storage& operator=(replica_storage o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  bool* data() noexcept { return p_.get(); }
  const bool* data() const noexcept { return p_.get(); }
  std::size_t size() const noexcept { return n_; }

 private:
  std::size_t n_ = 0;
  std::unique_ptr<bool[]> p_;
};

/// One value per replica, in replica order, as a read-only random-access range.
template <class T>
class replica_values {
 public:
  using value_type = T;
  using const_iterator = const T*;
  using iterator = const_iterator;

  /// Number of components (= replicas).
  std::size_t size() const noexcept { return values_.size(); }
  /// Component of replica `i`. Requires `i < size()`.
  const T& operator[](std::size_t i) const noexcept { return values_.data()[i]; }
  const_iterator begin() const noexcept { return values_.data(); }
  const_iterator end() const noexcept { return values_.data() + values_.size(); }

 protected:
  replica_values() = default;
  explicit replica_values(std::vector<T> values) : values_(std::move(values)) {}
  replica_storage<T> values_;
  friend struct access;
};

}  // namespace mirror::detail
