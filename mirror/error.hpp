// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The error hierarchy. Every error mirror raises derives from `mirror::error`, so one `catch`
/// handles them all; each message names the replica, the argument and the fix.

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <mirror/detail/format.hpp>

namespace mirror {

/// Base of every mirror error.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// From a message mirror formatted (detail::format).
  explicit error(const detail::message& what) : std::runtime_error(what.c_str()) {}
};

/// Replicas disagree on what they reduce: different leaf sizes, different nests, or different
/// collectives called in the same position. Raised on every replica before any value changes.
class shape_error : public error {
 public:
  using error::error;
};

/// A variable update that its aggregation does not allow (for example an update in replica
/// context of a `MirroredVariable` with `VariableAggregation::none`).
class aggregation_error : public error {
 public:
  using error::error;
};

/// An exception other than a `mirror::error` escaped `fn` on one replica. The original is kept as
/// the nested exception (`std::rethrow_if_nested(e)`); `replica()` says where it was thrown.
class replica_error : public error, public std::nested_exception {
 public:
  ///@{
  /// `what` is the original exception's message; `replica` the replica whose `fn` threw it.
  replica_error(int replica, const char* what)
      : error(detail::format("mirror: replica %d threw: %s", replica, what)), replica_(replica) {}
  replica_error(int replica, const std::string& what) : replica_error(replica, what.c_str()) {}
  ///@}
  /// The replica id (`replica_id_in_sync_group`) whose `fn` threw.
  int replica() const noexcept { return replica_; }

 private:
  int replica_;
};

/// A collective that not every replica reached: some replicas returned from `fn` without calling
/// it, or did not arrive within the device's timeout. `missing()` lists them.
class timeout_error : public error {
 public:
  ///@{
  /// `what` is the message; `missing` the replica ids that did not arrive.
  timeout_error(std::string what, std::vector<int> missing)
      : error(std::move(what)), missing_(std::move(missing)) {}
  timeout_error(const detail::message& what, std::vector<int> missing)
      : error(what), missing_(std::move(missing)) {}
  ///@}
  /// Replica ids that never arrived, in increasing order.
  const std::vector<int>& missing() const noexcept { return missing_; }

 private:
  std::vector<int> missing_;
};

/// Workers of a multi-worker strategy died (their processes ended) while the strategy existed:
/// raised on every surviving worker, by the collective that found the loss or by the next
/// cross-worker call, in place of a timeout. The strategy that raised it cannot continue; build
/// a new one on the survivors (`mirror::elastic`, docs/multi-worker.md\#losing-a-worker).
/// Raised only by an MPI with its fault-tolerance extension, launched with it on; elsewhere a
/// dead process ends the job.
class worker_lost_error : public error {
 public:
  ///@{
  /// `what` is the message; `workers` the lost workers' indices in the strategy's worker group,
  /// `replicas` their global replica ids, both in increasing order.
  worker_lost_error(std::string what, std::vector<int> workers, std::vector<int> replicas)
      : error(std::move(what)), workers_(std::move(workers)), replicas_(std::move(replicas)) {}
  worker_lost_error(const detail::message& what, std::vector<int> workers, std::vector<int> replicas)
      : error(what), workers_(std::move(workers)), replicas_(std::move(replicas)) {}
  ///@}
  /// The lost workers (their indices in the strategy that raised the error), in increasing order.
  const std::vector<int>& workers() const noexcept { return workers_; }
  /// The lost workers' global replica ids in that strategy, in increasing order.
  const std::vector<int>& replicas() const noexcept { return replicas_; }

 private:
  std::vector<int> workers_;
  std::vector<int> replicas_;
};

/// A failure reported by a vendor API (CUDA, NCCL, MPI), with its numeric code and text.
class backend_error : public error {
 public:
  ///@{
  /// `what` names the call and the vendor's text; `code` is the vendor's error code.
  backend_error(std::string what, long code) : error(std::move(what)), code_(code) {}
  backend_error(const detail::message& what, long code) : error(what), code_(code) {}
  ///@}
  /// The vendor's error code (`cudaError_t`, `ncclResult_t`, MPI error class).
  long code() const noexcept { return code_; }

 private:
  long code_;
};

}  // namespace mirror
