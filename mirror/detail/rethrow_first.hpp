// SPDX-License-Identifier: Apache-2.0
#pragma once
// What Strategy::run does with the replicas' exceptions once every replica has returned.

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <utility>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/detail/agreement_check.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/error.hpp>
#include <mirror/flight_recorder.hpp>

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
/// `first_replica + r` and, from `recorder` (when given), the last collective that replica
/// called before it threw, with its call site. (Not a member of Strategy: one copy per program,
/// not one per policy.)
MIRROR_DETAIL_INLINE void rethrow_first(replica_errors& errors, int first_replica,
                                        const FlightRecorder* recorder = nullptr);
/// " (its last collective call was collective #2 (all_reduce(sum)) at a.cpp:9)", or " (before
/// any collective of fn)": where in fn a replica's exception came, from its position `p`.
MIRROR_DETAIL_INLINE message failure_site(const collective_position& p);
/// What a multi-worker strategy tells the other workers of the exception `e` that fn threw on
/// the calling replica's thread (called while it is still in fn): a mirror::error as it is (its
/// text names its call sites), anything else as a std::runtime_error whose text ends with
/// failure_site of the thread's position, so that every worker's replica_error says where.
MIRROR_DETAIL_INLINE std::exception_ptr with_failure_site(const std::exception_ptr& e) noexcept;
/// Throws replica_error(replica, what + where); called from a handler, so the error nests the
/// exception being handled. (One copy of the throw for rethrow_first's two handlers.)
[[noreturn, gnu::cold]] MIRROR_DETAIL_INLINE void throw_replica_error(int replica, const char* what,
                                                                     const message& where);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void keep_current_exception(replica_errors& errors, std::size_t r) noexcept {
  errors[r] = std::current_exception();
}

MIRROR_DETAIL_INLINE void rethrow_first(replica_errors& errors, int first_replica, const FlightRecorder* recorder) {
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
  } catch (...) {
    // Where in fn it threw: after (or in) which collective, the replica's latest of this run.
    message where;
    if (recorder != nullptr) where = failure_site(recorder->last(replica));
    try {
      throw;
    } catch (const std::exception& e) {
      throw_replica_error(first_replica + replica, e.what(), where);
    } catch (...) {
      throw_replica_error(first_replica + replica, "an exception not derived from std::exception", where);
    }
  }
}

MIRROR_DETAIL_INLINE message failure_site(const collective_position& p) {
  return p.sequence == 0 ? format(" (before any collective of fn)")
                         : format(" (its last collective call was %s)", describe_position(p, "").c_str());
}

MIRROR_DETAIL_INLINE std::exception_ptr with_failure_site(const std::exception_ptr& e) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const error&) {
    return e;
  } catch (const std::exception& x) {
    try {
      return std::make_exception_ptr(
          std::runtime_error(format("%s%s", x.what(), failure_site(current_position).c_str()).c_str()));
    } catch (...) {
      return e;  // out of memory: the original
    }
  } catch (...) {
    return e;
  }
}

MIRROR_DETAIL_INLINE void throw_replica_error(int replica, const char* what, const message& where) {
  throw replica_error(replica, format("%s%s", what, where.c_str()).c_str());  // nests the exception being handled
}
#endif

}  // namespace mirror::detail
