// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cuda::impl::basic_device_guard`: makes a CUDA device current for one scope and gives
/// the thread its previous device back however the scope ends. CUDA's current device is per
/// thread, and a caller's thread (or a replica's, inside `fn`) must find it as it left it.

namespace mirror::cuda::impl {

/// `Api` supplies three static functions: `int current()` (the thread's current device; throws
/// on failure), `void make_current(int)` (throws on failure) and `void restore(int) noexcept`
/// (best effort). libmirror_cuda instantiates it with the CUDA runtime; tests with a fake.
/// No call is made when the device is current already, so a replica's hot path pays one query.
template <class Api>
class basic_device_guard {
 public:
  explicit basic_device_guard(int device) : previous_(Api::current()) {
    if (previous_ != device) {
      Api::make_current(device);
      changed_ = true;
    }
  }
  basic_device_guard(const basic_device_guard&) = delete;
  basic_device_guard& operator=(const basic_device_guard&) = delete;
  ~basic_device_guard() {
    if (changed_) Api::restore(previous_);
  }

  /// The device that was current before the guard.
  int previous() const noexcept { return previous_; }

 private:
  int previous_;
  bool changed_ = false;
};

}  // namespace mirror::cuda::impl
