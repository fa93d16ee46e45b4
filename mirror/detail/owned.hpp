// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::detail::owned<T>`: the sole owner of one heap object, for members of classes that
/// every translation unit including <mirror/mirror.hpp> parses.

namespace mirror::detail {

/// What mirror's headers used of `std::unique_ptr<T>`: delete on destruction, no copies, access.
/// Written out because a `std::unique_ptr<X>` member whose type does not depend on a template
/// parameter is instantiated (with its deleter storage, a std::tuple) wherever the class is
/// parsed, used or not (docs/design.md\#compile-time).
///
/// It is also how every backend hides its vendor's state (docs/design.md\#adding-a-backend): a
/// type the backend's header declares and only its compiled source defines, freed by a
/// `destroy(T*) noexcept` declared beside it, which the destructor finds by argument-dependent
/// lookup. Such a `T` may stay incomplete in every header. A `T` without `destroy` is deleted, and
/// must be complete where the destructor is instantiated (the owner's out-of-line destructor, as
/// with unique_ptr). Not movable: its owners are not either.
template <class T>
class owned {
 public:
  explicit owned(T* p) noexcept : p_(p) {}
  owned(const owned&) = delete;
  owned& operator=(const owned&) = delete;
  ~owned() {
    if constexpr (requires { destroy(p_); }) {
      destroy(p_);
    } else {
      static_assert(sizeof(T) > 0, "mirror::detail::owned<T>: T is incomplete here and has no destroy(T*)");
      delete p_;
    }
  }

  T* get() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  T* operator->() const noexcept { return p_; }

 private:
  T* p_;
};

}  // namespace mirror::detail
