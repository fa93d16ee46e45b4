// SPDX-License-Identifier: Apache-2.0
#pragma once
// The collectives a replica has started and not yet completed (ReplicaContext's non-blocking
// forms, mirror/pending.hpp): completed in the order they were started, whoever asks.

#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

namespace mirror::detail {

/// One started collective whose completion is still due (a `Pending`'s or a gradient bucket's).
/// Owned by its handle; listed in the replica's async_queue until it completes.
class async_op {
 public:
  virtual ~async_op() = default;
  /// Whether completing it would not block.
  virtual bool done() const noexcept = 0;
  /// Whether it has completed (successfully or not).
  bool completed() const noexcept { return completed_; }
  /// What completing it threw, or null.
  const std::exception_ptr& error() const noexcept { return error_; }

 protected:
  /// Blocks until the collective is complete and its result in place; throws its error.
  virtual void complete() = 0;

 private:
  friend class async_queue;
  bool completed_ = false;
  std::exception_ptr error_;
};

/// A replica's started collectives, in start order (ReplicaContext owns one). Completing one
/// completes every one started before it first, so that they complete in order on every
/// replica. Nothing here throws except `finish`, which reports what nobody waited for.
class async_queue {
 public:
  async_queue() = default;
  async_queue(const async_queue&) = delete;
  async_queue& operator=(const async_queue&) = delete;
  /// Completes (quietly) whatever is left: fn threw, or a handle escaped.
  ~async_queue() {
    while (!empty()) complete_front();
  }

  /// Lists a started collective (its handle completes it before freeing it).
  void push(async_op& op) { ops_.push_back(&op); }

  /// Completes every listed collective up to and including `op`, in start order, keeping what
  /// each throws in it (`op.error()`). A no-op when `op` has completed.
  void complete_through(const async_op& op) noexcept {
    while (!op.completed() && !empty()) complete_front();
  }

  /// Whether completing every listed collective up to `op` would not block.
  bool ready_through(const async_op& op) const noexcept {
    if (op.completed()) return true;
    for (std::size_t i = head_; i < ops_.size(); ++i) {
      if (!ops_[i]->done()) return false;
      if (ops_[i] == &op) return true;
    }
    return true;
  }

  /// A handle that was destroyed without `wait()` completed its collective in its destructor:
  /// the first such error is kept here, for `finish`.
  void dropped(const async_op& op) noexcept {
    if (op.error() != nullptr && dropped_ == nullptr) dropped_ = op.error();
  }

  /// An error found where nothing may throw (a destructor inside fn), for `finish` to throw
  /// when fn returns; the first one is kept (after a dropped handle's).
  void fail_at_end(std::exception_ptr e) noexcept {
    if (dropped_ == nullptr) dropped_ = std::move(e);
  }

  /// At the end of fn: completes everything still listed (handles that escaped fn), then
  /// throws the first error of a collective nobody waited for.
  void finish() {
    while (!empty()) {
      async_op* o = ops_[head_];
      complete_front();
      dropped(*o);
    }
    if (dropped_ != nullptr) std::rethrow_exception(std::exchange(dropped_, nullptr));
  }

  /// Whether no started collective is waiting to complete.
  bool empty() const noexcept { return head_ == ops_.size(); }

 private:
  void complete_front() noexcept {
    async_op* o = ops_[head_++];
    if (head_ == ops_.size()) {
      ops_.clear();  // keeps its capacity: a training step's buckets allocate once per run
      head_ = 0;
    }
    try {
      o->complete();
    } catch (...) {
      o->error_ = std::current_exception();
    }
    o->completed_ = true;
  }

  std::vector<async_op*> ops_;  // [head_, end): started, not completed, oldest first
  std::size_t head_ = 0;
  std::exception_ptr dropped_;
};

}  // namespace mirror::detail
