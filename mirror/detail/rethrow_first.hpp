// SPDX-License-Identifier: Apache-2.0
#pragma once
// What Strategy::run does with the replicas' exceptions once every replica has returned.

#include <cstddef>
#include <exception>
#include <utility>
#include <vector>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/error.hpp>

namespace mirror::detail {

/// Rethrows the lowest replica's exception, if any, and leaves `errors` empty for the next run:
/// a mirror::error as it is, anything else as a replica_error naming global replica
/// `first_replica + r`. (Not a member of Strategy: one copy per program, not one per policy.)
MIRROR_DETAIL_INLINE void rethrow_first(std::vector<std::exception_ptr>& errors, int first_replica);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void rethrow_first(std::vector<std::exception_ptr>& errors, int first_replica) {
  std::exception_ptr first;
  int replica = 0;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;  // the common case: no call into exception_ptr's out-of-line members
    if (!first) {
      first = std::move(errors[r]);
      replica = static_cast<int>(r);
    }
    errors[r] = nullptr;
  }
  if (!first) return;
  try {
    std::rethrow_exception(first);
  } catch (const error&) {
    throw;
  } catch (const std::exception& e) {
    throw replica_error(first_replica + replica, e.what());
  } catch (...) {
    throw replica_error(first_replica + replica, "an exception not derived from std::exception");
  }
}
#endif

}  // namespace mirror::detail
