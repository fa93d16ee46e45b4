// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::reduce_scatter_in_flight<E>`: one replica's part of an `ops::Hierarchical`
/// reduce-scatter that was started (`ReplicaContext::reduce_scatter_async`) and has not completed.

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/worker_group.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// Between `Hierarchical::reduce_scatter_start` and `finish`: the cross-worker step is on the
/// worker's communication thread (one local replica, so this replica's cut is its worker's
/// whole range), reading the replica's leaves and writing straight into its cut of each.
template <class E>
class reduce_scatter_in_flight {
 public:
  reduce_scatter_in_flight() = default;  // nothing in flight (completed at the start)
  /// Takes over another handle's part.
  reduce_scatter_in_flight(reduce_scatter_in_flight&&) noexcept = default;
  /// Finishes this part quietly (as the destructor does), then takes over `other`'s.
  reduce_scatter_in_flight& operator=(reduce_scatter_in_flight&& other) noexcept {
    if (this != &other) {
      drop();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~reduce_scatter_in_flight() { drop(); }

  /// What the cross step works on, and what finish() does after it.
  struct state {
    std::unique_ptr<detail::worker_group::started_collective> cross;  ///< the posted step
    std::vector<E*> out;                 ///< per leaf, this replica's cut
    std::vector<std::size_t> out_sizes;  ///< per leaf, the cut's elements
    ReduceOp op = ReduceOp::sum;         ///< the user's op (a mean is divided here)
    std::size_t divisor = 1;             ///< W*R, for a mean
  };
  /// (Made by Hierarchical::reduce_scatter_start.)
  explicit reduce_scatter_in_flight(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}

  /// Blocks until the cross step is done, then leaves the cuts in place (a mean divided);
  /// throws the cross step's error. Once.
  void finish() {
    if (state_ == nullptr) return;
    const std::unique_ptr<state> s = std::move(state_);
    s->cross->wait();
    for (std::size_t k = 0; k < s->out.size(); ++k) {
      if (s->op == ReduceOp::mean) detail::divide_all(s->out[k], s->out_sizes[k], s->divisor);
    }
  }
  /// Whether finish() would return at once.
  bool done() const noexcept { return state_ == nullptr || state_->cross->done(); }

 private:
  void drop() noexcept {
    if (state_ == nullptr) return;
    try {
      finish();
    } catch (...) {
      // dropped: the replica's fn is unwinding, or its handle was destroyed unwaited
    }
  }

  std::unique_ptr<state> state_;
};

}  // namespace mirror::ops
