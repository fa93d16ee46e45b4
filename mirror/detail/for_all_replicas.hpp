// SPDX-License-Identifier: Apache-2.0
#pragma once
// A step of a collective that one replica makes for all of them (replica 0's cross-worker step):
// what it throws must be every replica's error, as the agreement check's is, not a cancellation
// on the replicas that wait for it (docs/errors.md#replica_error: an error of the collective itself
// is every replica's).

#include <exception>
#include <utility>
#include <mirror/backend/collective_cancelled.hpp>

namespace mirror::detail {

/// Runs `step` on the calling replica for every replica of `rt`. An exception from it is published
/// through `rt.fail_collective` where the runtime has it (threads, and the runtimes built on it):
/// the replicas waiting in, or later reaching, an exchange or barrier of this parallel call throw
/// the same exception, and the caller rethrows it. A cancellation (another replica failed first)
/// passes through unpublished.
template <class Rt, class Step>
void for_all_replicas(Rt& rt, Step&& step) {
  if constexpr (requires(Rt& r, std::exception_ptr e) { r.fail_collective(e); }) {
    try {
      std::forward<Step>(step)();
    } catch (const backend::collective_cancelled_rethrow_me&) {
      throw;
    } catch (...) {
      rt.fail_collective(std::current_exception());
      throw;
    }
  } else {
    (void)rt;
    std::forward<Step>(step)();
  }
}

}  // namespace mirror::detail
