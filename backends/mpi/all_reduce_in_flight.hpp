// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::all_reduce_in_flight<E>`: one replica's part of an `ops::Hierarchical`
/// all-reduce that was started (`ReplicaContext::all_reduce_async`) and has not completed.

#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/worker_group.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// Between `Hierarchical::all_reduce_start` and `finish`: the cross-worker step is on the
/// worker's communication thread, and every local replica's leaves already hold the local sum.
///
/// The local replicas share one delivery: whichever of them finishes first waits for the cross
/// step, divides a `mean` and copies the result into every local replica's leaves; the others
/// find it done. So finishing never waits for another local replica to arrive anywhere: replicas
/// may wait for their collectives in any order, and a handle dropped while `fn` unwinds still
/// completes (delivery writes into every replica's leaves, which each replica keeps alive until
/// its own part has finished).
template <class E>
class all_reduce_in_flight {
 public:
  all_reduce_in_flight() = default;  // nothing in flight (a single worker completed at the start)
  /// Takes over another replica handle's part.
  all_reduce_in_flight(all_reduce_in_flight&&) noexcept = default;
  /// Finishes this part quietly (as the destructor does), then takes over `other`'s.
  all_reduce_in_flight& operator=(all_reduce_in_flight&& other) noexcept {
    if (this != &other) {
      drop();
      shared_ = std::move(other.shared_);
    }
    return *this;
  }
  ~all_reduce_in_flight() { drop(); }

  /// Blocks until this replica's leaves hold the result; throws the cross step's error (the
  /// same exception on every local replica). Once.
  void finish() {
    if (shared_ == nullptr) return;
    const std::shared_ptr<delivery> d = std::move(shared_);
    d->deliver();
  }
  /// Whether finish() would return at once.
  bool done() const noexcept { return shared_ == nullptr || shared_->done(); }

  /// What the local replicas share (made by replica 0 in all_reduce_start).
  struct delivery {
    std::mutex mutex;        ///< serialises deliver()
    bool delivered = false;  ///< deliver() has run (guarded by mutex)
    std::exception_ptr error;  ///< what the delivery threw, rethrown to every local replica
    std::unique_ptr<detail::worker_group::started_collective> cross;  ///< set before any replica can finish
    /// Per local replica, its leaves (each writes its own entry); replica 0's are the ones the
    /// cross step reduces in place.
    std::vector<std::vector<E*>> leaves;
    std::vector<std::size_t> sizes;       ///< per leaf, its elements
    ReduceOp op = ReduceOp::sum;          ///< the user's op (a mean is divided here)
    std::size_t divisor = 1;              ///< W*R, for a mean

    /// Whether deliver() would not wait for the cross-worker step.
    bool done() const noexcept {
      // (`delivered` is read without the mutex only as a hint; cross->done() is atomic.)
      return cross == nullptr || cross->done();
    }
    /// The result, computed once, into every local replica's leaves.
    void deliver() {
      std::lock_guard lock(mutex);
      if (!delivered) {
        delivered = true;
        try {
          if (cross != nullptr) cross->wait();
          for (std::size_t k = 0; k < sizes.size(); ++k) {
            E* const source = leaves[0][k];
            if (op == ReduceOp::mean) detail::divide_all(source, sizes[k], divisor);
            for (const std::vector<E*>& mine : leaves) {
              if (mine[k] != source && sizes[k] > 0) std::memcpy(mine[k], source, sizes[k] * sizeof(E));
            }
          }
        } catch (...) {
          error = std::current_exception();
        }
      }
      if (error != nullptr) std::rethrow_exception(error);
    }
  };

  /// (Made by Hierarchical::all_reduce_start.)
  explicit all_reduce_in_flight(std::shared_ptr<delivery> d) noexcept : shared_(std::move(d)) {}

 private:
  void drop() noexcept {
    if (shared_ == nullptr) return;
    try {
      finish();
    } catch (...) {
      // dropped: the replica's fn is unwinding, or its handle was destroyed unwaited
    }
  }

  std::shared_ptr<delivery> shared_;
};

}  // namespace mirror::ops
