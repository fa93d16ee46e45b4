// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cuda::device_buffer<E>`: an owning `cudaMalloc` buffer on one GPU, for tests,
/// benchmarks and programs that want device memory without including CUDA headers.

#include <cstddef>
#include <span>
#include <utility>
#include <mirror/backends/cuda/device_span.hpp>

namespace mirror::cuda {
namespace impl {
void* buffer_allocate(int device, std::size_t bytes);  // backend_error on failure
void buffer_free(int device, void* p) noexcept;
void buffer_upload(int device, void* dst, const void* src, std::size_t bytes);    // synchronous
void buffer_download(int device, void* dst, const void* src, std::size_t bytes);  // synchronous
}  // namespace impl

/// `size` elements of E in device memory on `device` (uninitialised). Move-only.
template <class E>
class device_buffer {
 public:
  device_buffer() = default;  ///< no memory
  /// Allocates `size` elements on CUDA device `device` (`backend_error` when it cannot); the
  /// calling thread's current device is left as it was.
  device_buffer(int device, std::size_t size)
      : data_(static_cast<E*>(impl::buffer_allocate(device, size * sizeof(E)))), size_(size), device_(device) {}
  ///@{
  /// Takes `o`'s memory; `o` is left empty (the assignment hands `o` this buffer's old memory).
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), device_(o.device_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    return *this;
  }
  ///@}
  ~device_buffer() { impl::buffer_free(device_, data_); }

  E* data() const noexcept { return data_; }            ///< the device address (never read it on the host)
  std::size_t size() const noexcept { return size_; }   ///< elements
  int device() const noexcept { return device_; }       ///< the CUDA device ordinal that owns it
  /// The buffer as a leaf, reduced in place.
  device_span<E> span() const noexcept { return {data_, size_}; }

  /// Copies `host` (at most size() elements) to the start of the buffer; waits for the device.
  void upload(std::span<const E> host) { impl::buffer_upload(device_, data_, host.data(), host.size_bytes()); }
  /// Copies the start of the buffer into `host`; waits for the device (and all its streams).
  void download(std::span<E> host) const { impl::buffer_download(device_, host.data(), data_, host.size_bytes()); }

 private:
  E* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = 0;
};

}  // namespace mirror::cuda
