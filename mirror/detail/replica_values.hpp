// SPDX-License-Identifier: Apache-2.0
#pragma once
// The storage and range interface shared by PerReplica<T> and Mirrored<T>.

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace mirror::detail {

struct access;  // the one place allowed to build Mirrored / Synced values

/// Tags the constructors that take a replica_storage (private to PerReplica and Mirrored, and
/// out of overload resolution for a braced list of values).
struct adopt_storage_t {
  explicit adopt_storage_t() = default;
};

/// Raw memory for n values of T (none constructed), freed by release_values.
template <class T>
T* allocate_values(std::size_t n) {
  if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignof(T)}));
  } else {
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
}
template <class T>
void release_values(T* p) noexcept {
  if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
    ::operator delete(p, std::align_val_t{alignof(T)});
  } else {
    ::operator delete(p);
  }
}

/// One value per replica, contiguous, in replica order; its size is fixed when it is built.
/// Not a std::vector: `run` builds each replica's result in its final place (replica_builder),
/// and a vector has no way to take values built in place. That also keeps the code each result
/// type instantiates small (docs/design.md\#compile-time). Contiguous for every T, bool too.
template <class T>
class replica_storage {
 public:
  replica_storage() noexcept = default;
  explicit replica_storage(std::vector<T>&& v) : replica_storage(v.size()) {
    for (std::size_t i = 0; i < v.size(); ++i) construct(std::move(v[i]));  // (vector<bool>: a proxy)
  }
  /// n copies of `value`.
  replica_storage(std::size_t n, const T& value) : replica_storage(n) {
    for (std::size_t i = 0; i < n; ++i) construct(value);
  }
  replica_storage(const replica_storage& other) : replica_storage(other.n_) {
    for (std::size_t i = 0; i < other.n_; ++i) construct(other.p_[i]);
  }
  replica_storage(replica_storage&& other) noexcept : p_(other.p_), n_(other.n_), capacity_(other.capacity_) {
    other.p_ = nullptr;
    other.n_ = other.capacity_ = 0;
  }
  // Two assignments, not one by value: with a by-value parameter the implicit copy assignment of
  // a class holding this one is noexcept to GCC 12 while the copy it makes may throw.
  replica_storage& operator=(const replica_storage& other) {
    replica_storage copy(other);
    return *this = std::move(copy);
  }
  replica_storage& operator=(replica_storage&& other) noexcept {
    std::swap(p_, other.p_);
    std::swap(n_, other.n_);
    std::swap(capacity_, other.capacity_);
    return *this;
  }
  ~replica_storage() {
    for (std::size_t i = n_; i > 0; --i) p_[i - 1].~T();
    release_values(p_);
  }

  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  template <class>
  friend class replica_builder;
  // Room for `capacity` values, none built. (The delegating constructors above finish a
  // construction first: a throwing element then destroys the ones already built.)
  explicit replica_storage(std::size_t capacity)
      : p_(capacity > 0 ? allocate_values<T>(capacity) : nullptr), capacity_(capacity) {}
  template <class... A>
  void construct(A&&... args) {
    ::new (static_cast<void*>(p_ + n_)) T(std::forward<A>(args)...);
    ++n_;
  }

  T* p_ = nullptr;
  std::size_t n_ = 0;         // built: p_[0, n_)
  std::size_t capacity_ = 0;  // allocated
};

/// Where `run` builds its replicas' results: room for one value per replica, each built by its
/// replica, concurrently (different values, different flags); then `finish()` hands them over
/// as a replica_storage without moving them. A builder destroyed before that (a replica threw)
/// destroys the values that were built.
template <class T>
class replica_builder {
 public:
  explicit replica_builder(std::size_t n) : storage_(n), built_(new bool[n]()) {}
  replica_builder(const replica_builder&) = delete;
  replica_builder& operator=(const replica_builder&) = delete;
  ~replica_builder() {
    // (After finish() the storage is moved out: capacity 0.)
    for (std::size_t r = storage_.capacity_; r > 0; --r) {
      if (built_[r - 1]) storage_.p_[r - 1].~T();
    }
    delete[] built_;
  }

  /// Builds replica r's value from `args`.
  template <class... A>
  void build(int r, A&&... args) {
    ::new (static_cast<void*>(storage_.p_ + r)) T(std::forward<A>(args)...);
    built_[static_cast<std::size_t>(r)] = true;
  }

  /// Every replica's value. **Requires**: all are built.
  replica_storage<T> finish() && {
    storage_.n_ = storage_.capacity_;
    return std::move(storage_);
  }

 private:
  replica_storage<T> storage_;  // n_ stays 0 until finish(): ~replica_storage destroys nothing
  bool* built_;
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
  explicit replica_values(replica_storage<T> values) noexcept : values_(std::move(values)) {}
  replica_storage<T> values_;
  friend struct access;
};

}  // namespace mirror::detail
