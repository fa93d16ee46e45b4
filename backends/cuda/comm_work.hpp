// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cuda::comm_work`: a replica's collective on its communication stream, which the
/// replica's own stream has not waited for yet.

#include <utility>
#include <mirror/backends/cuda/cuda_runtime.hpp>

namespace mirror::cuda {

/// One replica's part of a collective started on its communication stream (what
/// `ops::NcclAllReduce::all_reduce_start` returns). `finish()` makes the replica's stream wait
/// for it (an event: the host does not wait), so that what `fn` enqueues afterwards sees the
/// result; work enqueued on the replica's stream before `finish()` runs beside the collective.
/// Move-only; a part destroyed unfinished finishes (quietly) in its destructor.
class comm_work {
 public:
  /// Nothing to finish.
  comm_work() = default;
  /// `mark`: from `rt.mark_comm(self)`, recorded after the collective's last piece of work.
  comm_work(runtime& rt, int self, void* mark) noexcept : rt_(&rt), self_(self), mark_(mark) {}
  /// Takes over `other`'s part; `other` has nothing left to finish.
  comm_work(comm_work&& other) noexcept
      : rt_(std::exchange(other.rt_, nullptr)), self_(other.self_), mark_(other.mark_) {}
  /// Finishes this part, then takes over `other`'s.
  comm_work& operator=(comm_work&& other) noexcept {
    if (this != &other) {
      drop();
      rt_ = std::exchange(other.rt_, nullptr);
      self_ = other.self_;
      mark_ = other.mark_;
    }
    return *this;
  }
  comm_work(const comm_work&) = delete;
  comm_work& operator=(const comm_work&) = delete;
  ~comm_work() { drop(); }

  /// Orders the replica's stream after the collective. Throws `mirror::backend_error` when CUDA
  /// refuses the wait. Once (later calls do nothing).
  void finish() {
    if (rt_ == nullptr) return;
    runtime& rt = *std::exchange(rt_, nullptr);
    rt.join_comm(self_, mark_);
  }
  /// True: finishing only enqueues a wait on the GPU, so it never blocks the host.
  bool done() const noexcept { return true; }

 private:
  // A CUDA failure here (a broken device) has no caller to go to; the replica's next CUDA call
  // reports the device's state.
  void drop() noexcept {
    try {
      finish();
    } catch (...) {
    }
  }

  runtime* rt_ = nullptr;
  int self_ = 0;
  void* mark_ = nullptr;
};

}  // namespace mirror::cuda
