// SPDX-License-Identifier: Apache-2.0
#pragma once
// What Strategy::run does with the replicas' exceptions once every replica has returned.

#include <cstddef>
#include <exception>
#include <utility>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/error.hpp>

namespace mirror::detail {

/// One slot per replica for the exception its `fn` threw (Strategy::run). A fixed array, not a
/// std::vector: nothing grows, and a vector's members were code every translation unit that
/// calls run compiled.
class replica_errors {
 public:
  explicit replica_errors(std::size_t n) : slots_(new std::exception_ptr[n]), n_(n) {}
  replica_errors(const replica_errors&) = delete;
  replica_errors& operator=(const replica_errors&) = delete;
  ~replica_errors() { delete[] slots_; }
  std::exception_ptr& operator[](std::size_t r) noexcept { return slots_[r]; }
  std::size_t size() const noexcept { return n_; }

 private:
  std::exception_ptr* slots_;
  std::size_t n_;
};

/// Keeps the exception being handled as replica r's (Strategy::run's handler calls it: one copy
/// of the exception_ptr code, not one per replica function).
MIRROR_DETAIL_INLINE void keep_current_exception(replica_errors& errors, std::size_t r) noexcept;

/// Rethrows the lowest replica's exception, if any, and leaves `errors` empty for the next run:
/// a mirror::error as it is, anything else as a replica_error naming global replica
/// `first_replica + r`. (Not a member of Strategy: one copy per program, not one per policy.)
MIRROR_DETAIL_INLINE void rethrow_first(replica_errors& errors, int first_replica);
/// Throws replica_error(replica, what); called from a handler, so the error nests the exception
/// being handled. (One copy of the throw for rethrow_first's two handlers.)
[[noreturn, gnu::cold]] MIRROR_DETAIL_INLINE void throw_replica_error(int replica, const char* what);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void keep_current_exception(replica_errors& errors, std::size_t r) noexcept {
  errors[r] = std::current_exception();
}

MIRROR_DETAIL_INLINE void rethrow_first(replica_errors& errors, int first_replica) {
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
    throw_replica_error(first_replica + replica, e.what());
  } catch (...) {
    throw_replica_error(first_replica + replica, "an exception not derived from std::exception");
  }
}

MIRROR_DETAIL_INLINE void throw_replica_error(int replica, const char* what) {
  throw replica_error(replica, what);  // nests the exception being handled
}
#endif

}  // namespace mirror::detail
