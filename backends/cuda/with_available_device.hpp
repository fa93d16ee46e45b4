// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cuda::with_available_device(fn)`: run on the GPUs when there are any, on the CPU
/// otherwise — the C++ form of TF's "no GPU found, using the CPU".

#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <mirror/backends/cuda/cuda_device.hpp>
#include <mirror/backends/cuda/cuda_runtime.hpp>
#include <mirror/backends/threads/threads.hpp>
#include <mirror/strategy.hpp>

namespace mirror::cuda {

/// Which device `with_device` builds a strategy on.
enum class device_choice { automatic, cuda, threads };

/// Parses "auto", "cuda" or "threads" (command-line flags); `std::invalid_argument` otherwise.
inline device_choice parse_device_choice(std::string_view s) {
  if (s == "auto") return device_choice::automatic;
  if (s == "cuda") return device_choice::cuda;
  if (s == "threads") return device_choice::threads;
  throw std::invalid_argument("mirror: unknown device '" + std::string(s) + "'; use cuda, threads or auto");
}

/// Builds `Strategy<devices::Cuda>` (from `gpu`) or `Strategy<devices::Threads>` (from `cpu`)
/// and returns `fn(strategy)`. `fn` is generic (`[](auto& strategy) {...}`) and must return the
/// same type for both. `automatic` takes CUDA when `device_count() > 0`; `cuda` without a GPU
/// throws the device's `mirror::backend_error`.
template <class F>
decltype(auto) with_device(device_choice choice, F&& fn, devices::Cuda gpu = {}, devices::Threads cpu = {}) {
  using on_gpu = std::invoke_result_t<F&, Strategy<devices::Cuda>&>;
  using on_cpu = std::invoke_result_t<F&, Strategy<devices::Threads>&>;
  static_assert(std::is_same_v<on_gpu, on_cpu>,
                "mirror::cuda::with_device(choice, fn): fn must return the same type for Strategy<devices::Cuda>& "
                "and Strategy<devices::Threads>&");
  if (choice == device_choice::cuda || (choice == device_choice::automatic && device_count() > 0)) {
    Strategy<devices::Cuda> strategy{std::move(gpu)};
    return static_cast<on_gpu>(fn(strategy));
  }
  Strategy<devices::Threads> strategy{std::move(cpu)};
  return static_cast<on_cpu>(fn(strategy));
}

/// `with_device(device_choice::automatic, fn, ...)`: CUDA when a GPU is present, else threads.
template <class F>
decltype(auto) with_available_device(F&& fn, devices::Cuda gpu = {}, devices::Threads cpu = {}) {
  return with_device(device_choice::automatic, std::forward<F>(fn), std::move(gpu), std::move(cpu));
}

}  // namespace mirror::cuda
