// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::Pending<R>`: a collective started in `fn` whose result is still to come.

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <mirror/detail/async_queue.hpp>
#include <mirror/error.hpp>

namespace mirror {

template <class> class ReplicaContext;
template <class T, bool Sharded> class GradientBuckets;

namespace detail {
/// A started collective that produces an `R` when it completes.
template <class R>
class async_result : public async_op {
 public:
  /// The result, once completed without error.
  std::optional<R> value;
};
}  // namespace detail

/// What `ctx.all_reduce_async`, `reduce_scatter_async`, `all_gather_async` and `broadcast_async`
/// return: the collective has started, every replica's part of it is under way (or done), and
/// `wait()` gives what the blocking form returns (docs/guide.md\#overlapping-communication).
///
/// Move-only. Valid only inside the `fn` that started it.
/// * `wait()` once: blocks until complete, then returns the result or throws what the blocking
///   form throws. Collectives complete in the order they were started: waiting for one first
///   completes every one this replica started before it.
/// * A span leaf belongs to the collective from the start until `wait()`: reading or writing it
///   meanwhile is undefined.
/// * A `Pending` destroyed without `wait()` completes its collective in its destructor (so
///   nothing writes into a buffer after that), and its error, if any, is thrown when `fn`
///   returns (Strategy::run reports it, as any exception from `fn`).
template <class R>
class Pending {
 public:
  /// The type `wait()` returns.
  using value_type = R;

  /// Takes over `other`'s collective; `other` owns nothing afterwards.
  Pending(Pending&& other) noexcept
      : value_(std::move(other.value_)), later_(std::move(other.later_)), queue_(other.queue_), waited_(other.waited_) {
    other.waited_ = true;
  }
  /// Completes this handle's own collective (as the destructor does), then takes over `other`'s.
  Pending& operator=(Pending&& other) noexcept {
    if (this != &other) {
      drop();
      value_ = std::move(other.value_);
      later_ = std::move(other.later_);
      queue_ = other.queue_;
      waited_ = std::exchange(other.waited_, true);
    }
    return *this;
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() { drop(); }

  /// Blocks until the collective (and every one this replica started before it) is complete;
  /// returns what the blocking form returns, or throws what it throws. Once: a second call
  /// throws `mirror::error`.
  R wait() {
    if (waited_) {
      throw error("mirror::Pending::wait: this collective's result was already taken (wait() is called once per "
                  "handle; keep the result it returned)");
    }
    waited_ = true;
    if (later_ == nullptr) return std::move(*value_);
    queue_->complete_through(*later_);
    if (later_->error() != nullptr) std::rethrow_exception(later_->error());
    return std::move(*later_->value);
  }

  /// Whether `wait()` would return without blocking: the collective and every one started
  /// before it are complete. (With several local replicas on `devices::Cluster`, the first to
  /// wait also copies the result to the others: a short copy, not a wait for peers. On
  /// `devices::Cuda` it is always true: `wait()` orders the replica's stream after the
  /// collective and never waits on the host.)
  bool ready() const noexcept { return later_ == nullptr || queue_->ready_through(*later_); }

 private:
  template <class> friend class ReplicaContext;
  template <class, bool> friend class GradientBuckets;
  /// A collective that completed as it started: its result.
  explicit Pending(R value) : value_(std::move(value)) {}
  /// A collective in flight, listed in `queue`.
  Pending(std::unique_ptr<detail::async_result<R>> op, detail::async_queue& queue)
      : later_(std::move(op)), queue_(&queue) {
    queue_->push(*later_);
  }

  void drop() noexcept {
    if (later_ == nullptr || waited_) return;
    waited_ = true;
    queue_->complete_through(*later_);
    queue_->dropped(*later_);
  }

  std::optional<R> value_;
  std::unique_ptr<detail::async_result<R>> later_;
  detail::async_queue* queue_ = nullptr;
  bool waited_ = false;
};

namespace detail {
template <class T> struct is_pending : std::false_type {};
template <class R> struct is_pending<Pending<R>> : std::true_type {};
}  // namespace detail

}  // namespace mirror
