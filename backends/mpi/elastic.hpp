// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::elastic`: a training loop that goes on after a worker dies, on the survivors, from
/// its last commit (docs/multi-worker.md\#losing-a-worker). `state` holds what the loop commits
/// (a host copy, equal on every worker, and the step it belongs to); `train` runs the loop on a
/// strategy over every worker and, after a `worker_lost_error`, on a new strategy over the
/// survivors, from the last commit they all hold.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>
#include <mirror/backends/mpi/cluster_device.hpp>
#include <mirror/backends/mpi/survivors.hpp>
#include <mirror/detail/element_kind.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/error.hpp>
#include <mirror/reduce_op.hpp>

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
/// optimiser's, counters), equal on every worker, and the step it belongs to.
///
/// A commit is local (a copy of `T`, no message): every worker commits at the same steps, and
/// after a loss `train` has the survivors agree on the latest commit that every one of them
/// holds. They differ by at most one: a worker cannot complete the step of its next commit
/// before every other worker has completed the steps before it, and so made the commit before
/// it. So each keeps its last two commits, and resumes from the older where another survivor
/// had not reached the newer. The input's position is the step: with a global batch per step,
/// split over the replicas in sync, the survivors re-split the same global batches, so no
/// sample is skipped or seen twice.
template <class T>
class state {
 public:
  /// Starts at step `step` (0: the beginning) with `initial` committed.
  explicit state(T initial, std::int64_t step = 0) : slots_{std::move(initial), std::nullopt}, steps_{step, -1} {}

  /// The last committed value.
  const T& value() const noexcept { return *slots_[latest_]; }
  /// The step the last commit belongs to: the loop resumes with it.
  std::int64_t step() const noexcept { return steps_[latest_]; }
  /// The strategies the loop ran on, in order (`train` adds one per strategy it builds).
  const std::vector<epoch>& epochs() const noexcept { return epochs_; }

  /// Commits `now` as the state after step `step` (a copy, into storage reused from the commit
  /// before the last). **Requires**: every worker commits at the same steps, after the step's
  /// collectives completed; between two commits at least one collective that every worker takes
  /// part in (a step's all-reduce of its gradients), which keeps the workers within one commit
  /// of each other; `step` greater than the last commit's. Where they are further apart after
  /// a loss, `train` throws `mirror::error` saying so.
  void commit(const T& now, std::int64_t step) {
    const int other = 1 - latest_;
    if (slots_[other]) {
      *slots_[other] = now;  // a vector's storage is reused: no allocation once the loop runs
    } else {
      slots_[other] = now;
    }
    steps_[other] = step;
    latest_ = other;
  }

 private:
  template <class Strategy, class U, class Fn, class OnLoss>
  friend void train(typename Strategy::device_type cluster, state<U>& st, Fn&& fn, OnLoss&& on_loss);

  // Back to the commit of step `agreed`, the latest every survivor holds: this worker's last, or
  // the one before.
  void resume_from(std::int64_t agreed) {
    if (steps_[latest_] == agreed) return;
    if (steps_[1 - latest_] == agreed && slots_[1 - latest_]) {
      latest_ = 1 - latest_;
      return;
    }
    throw error(detail::format("mirror::elastic::train: the survivors' latest common commit is step %lld, but this "
                               "worker holds steps %lld and %lld; every worker must commit at the same steps",
                               static_cast<long long>(agreed), static_cast<long long>(steps_[latest_]),
                               static_cast<long long>(steps_[1 - latest_])));
  }

  std::optional<T> slots_[2];
  std::int64_t steps_[2];
  int latest_ = 0;
  std::vector<epoch> epochs_;
};

/// Runs `fn(strategy, st)` on a strategy of `Strategy` (a `devices::Cluster` strategy) built from
/// `cluster`, and returns when `fn` does. `fn` builds what it needs from `st.value()` and
/// `st.step()`, runs its steps and `st.commit`s after each (or every few). When a worker dies
/// (`worker_lost_error` out of `fn`), every survivor destroys its strategy, builds the next one
/// on the survivors (`mpi::survivors`: fewer workers, global replica ids renumbered,
/// `num_replicas_in_sync()` smaller), agrees with the others on the latest commit they all hold
/// (one all-reduce) and calls `fn` again from it. Every other exception leaves `train` as it
/// came. Needs `mpi::fault_tolerant()` to survive a loss; elsewhere a dead process ends the job,
/// as without `train`.
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
      } catch (const worker_lost_error& e) {
        built = false;  // a worker died during the construction
        on_loss(e);
      }
      // Every survivor goes on with its strategy, or every one builds the next: a construction
      // can succeed on some and fail on others when a worker dies during it.
      if (fault_tolerant && !mpi::agree(cluster.comm, built, cluster.timeout)) built = false;
      if (built) {
        try {
          // The latest commit every worker holds (all hold the same one but after a loss).
          std::int64_t agreed = st.step();
          s->runtime().workers()->all_reduce(&agreed, 1, detail::element_kind_of<std::int64_t>(), ReduceOp::min,
                                             "mirror::elastic::train", false);
          st.resume_from(agreed);
          st.epochs_.push_back({st.step(), s->num_workers(), s->num_replicas_in_sync()});
          fn(*s, st);
          return;
        } catch (const worker_lost_error& e) {
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
