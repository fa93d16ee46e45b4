// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::elastic`: a training loop that goes on after a worker dies, on the survivors, from
/// its last commit (docs/multi-worker.md\#losing-a-worker). `state` holds what the loop commits
/// (a host copy, equal on every worker, and the step it belongs to); `train` runs the loop on a
/// strategy over every worker and, after a `worker_lost_error`, on a new strategy over the
/// survivors, from the last commit.

#include <cstdint>
#include <exception>
#include <optional>
#include <utility>
#include <vector>
#include <mirror/backends/mpi/cluster_device.hpp>
#include <mirror/backends/mpi/survivors.hpp>
#include <mirror/error.hpp>

namespace mirror::elastic {

/// A stretch of the job on one set of workers: from step `first_step` (the commit it started
/// from) on, `workers` workers with `replicas` replicas in sync. A reference that replays the
/// job (the same reductions over the same replicas per step) reads them from `state::epochs`.
struct epoch {
  std::int64_t first_step;  ///< the committed step this stretch started from
  int workers;              ///< workers in its strategy
  int replicas;             ///< `num_replicas_in_sync()` of its strategy
};

/// What an elastic loop commits: a value of `T` (any copyable type: the model's host values, the
/// optimiser's, counters), equal on every worker, and the step it belongs to. A commit is
/// collective and atomic: every surviving worker keeps the new value, or every one keeps the
/// previous one (`commit`). The input's position is the step: with a global batch per step,
/// split over the replicas in sync, the survivors re-split the same global batches, so no
/// sample is skipped or seen twice.
template <class T>
class state {
 public:
  /// Starts at step `step` (0: the beginning) with `initial` committed.
  explicit state(T initial, std::int64_t step = 0) : committed_(std::move(initial)), step_(step) {}

  /// The last committed value.
  const T& value() const noexcept { return committed_; }
  /// The step the last commit belongs to: the loop resumes with it.
  std::int64_t step() const noexcept { return step_; }
  /// The strategies the loop ran on, in order (`train` adds one per strategy it builds).
  const std::vector<epoch>& epochs() const noexcept { return epochs_; }

  /// Commits `now` as the state after step `step`, collectively: every worker votes whether it
  /// completed the step (here: yes), and the value is kept only where every live worker did
  /// (`mpi::group::vote`, uniform on every survivor). Where a worker died before or during
  /// the vote, or another worker's step failed, nothing is kept and the strategy's
  /// `worker_lost_error` is thrown, on every survivor: `train` then resumes from the previous
  /// commit. Call it between `run`s, on every worker alike.
  template <class Strategy>
  void commit(Strategy& strategy, const T& now, std::int64_t step) {
    auto& group = strategy.runtime().group();
    voted_ = true;
    if (!group.vote(true)) std::rethrow_exception(loss_of(group));
    voted_ = false;  // a new epoch of votes: a failure from here on has not voted yet
    committed_ = now;
    step_ = step;
  }

 private:
  template <class Strategy, class U, class Fn, class OnLoss>
  friend void train(typename Strategy::device_type cluster, state<U>& st, Fn&& fn, OnLoss&& on_loss);

  static std::exception_ptr loss_of(mpi::group& group) {
    if (auto e = group.loss(true)) return e;
    return std::make_exception_ptr(worker_lost_error(
        "mirror::elastic::state::commit: another worker's step failed, and MPI names no dead worker here", {}, {}));
  }

  T committed_;
  std::int64_t step_ = 0;
  std::vector<epoch> epochs_;
  bool voted_ = false;  // this worker already voted since the last kept commit (its vote was lost)
};

/// Runs `fn(strategy, st)` on a strategy of `Strategy` (a `devices::Cluster` strategy) built from
/// `cluster`, and returns when `fn` does. `fn` builds what it needs from `st.value()` and
/// `st.step()`, runs its steps and `st.commit`s after each (or every few). When a worker dies
/// (`worker_lost_error` out of `fn`, from a collective or from a commit), every survivor votes
/// against the step in flight if it has not voted yet, destroys its strategy, builds the next one
/// on the survivors (`mpi::survivors`: fewer workers, global replica ids renumbered,
/// `num_replicas_in_sync()` smaller) and calls `fn` again: it resumes from the last commit.
/// Every other exception leaves `train` as it came. Needs `mpi::fault_tolerant()` to survive a
/// loss; elsewhere a dead process ends the job, as without `train`.
///
/// `on_loss(const worker_lost_error&)`, when given, is called on every survivor after each loss,
/// before the next strategy is built (to log it, or to adjust what `fn` will read).
///
/// **Requires**: every worker calls it alike; `fn` lets `worker_lost_error` propagate.
template <class Strategy, class T, class Fn, class OnLoss>
void train(typename Strategy::device_type cluster, state<T>& st, Fn&& fn, OnLoss&& on_loss) {
  mpi::communicator made;  // the survivors' communicator this call made (released when replaced)
  struct release_at_exit {
    mpi::communicator& comm;
    ~release_at_exit() { mpi::release(comm); }
  } release{made};
  const bool fault_tolerant = mpi::fault_tolerant();
  for (;;) {
    {
      std::optional<Strategy> s;
      bool built = true;
      try {
        s.emplace(cluster);
      } catch (const worker_lost_error&) {
        built = false;  // a worker died during the construction
      }
      // Every survivor goes on with its strategy, or every one builds the next: a construction
      // can succeed on some and fail on others when a worker dies during it.
      if (fault_tolerant && !mpi::agree(cluster.comm, built, cluster.timeout)) built = false;
      if (built) {
        st.epochs_.push_back({st.step_, s->num_workers(), s->num_replicas_in_sync()});
        st.voted_ = false;
        try {
          fn(*s, st);
          return;
        } catch (const worker_lost_error& e) {
          // The survivors' votes pair up: every one votes once for the step in flight.
          if (!st.voted_) s->runtime().group().vote(false);
          on_loss(e);
        }
      }
    }  // the lost strategy is gone before the survivors build the next
    mpi::communicator next = mpi::survivors(cluster.comm);
    mpi::release(made);
    made = next;
    cluster.comm = next;
  }
}

/// `train` without a callback on a loss.
template <class Strategy, class T, class Fn>
void train(typename Strategy::device_type cluster, state<T>& st, Fn&& fn) {
  train<Strategy>(std::move(cluster), st, std::forward<Fn>(fn), [](const worker_lost_error&) {});
}

}  // namespace mirror::elastic
