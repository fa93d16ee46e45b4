// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::backend::collective`: one collective call as an ops policy sees it.

#include <cstddef>
#include <mirror/backend/exchanged.hpp>
#include <mirror/detail/agreement_check.hpp>
#include <mirror/detail/for_all_replicas.hpp>
#include <mirror/error.hpp>
#include <mirror/detail/timeline.hpp>
#include <mirror/flight_recorder.hpp>

namespace mirror::backend {

/// The handle a cross-device ops policy receives for one collective call: the runtime, the
/// calling replica, and the synchronisation the policy may use. The call's agreement check (the
/// same collective, nest and shapes on every replica) rides on its first `exchange` or
/// `barrier`, so a policy never checks anything itself and checking costs no extra round.
template <class Rt>
class collective {
 public:
  /// Made by the collectives layer: `header` is the call's agreement check, or null for a
  /// collective that checks nothing (a later element type of the same call).
  collective(Rt& rt, int self, const detail::collective_header* header) noexcept
      : rt_(&rt), self_(self), header_(header), in_place_(header != nullptr && header->in_place) {}

  /// The device runtime, for its memory primitives (`copy`, `combine`, `divide`, `scratch`).
  /// Synchronise through this handle's `exchange` and `barrier`, not the runtime's: they carry
  /// the agreement check.
  Rt& runtime() const noexcept { return *rt_; }
  /// The calling replica (its id in this process's runtime).
  int self() const noexcept { return self_; }
  /// Whether the call writes memory the caller sees (span leaves, reduced in place) rather than
  /// copies it returns: a policy that must refuse before it writes checks agreement first then.
  /// Known on the call's first collective (the one with its header); false on later ones.
  bool writes_in_place() const noexcept { return in_place_; }
  /// The number of replicas in this process's runtime.
  int num_replicas() const noexcept { return rt_->num_replicas(); }

  /// All-gather of a small trivially copyable payload, and a barrier. The first exchange of a
  /// collective also checks that the replicas agree (mirror::shape_error otherwise, on all).
  template <class P>
  exchanged<P> exchange(const P& payload) {
    struct with_check {
      detail::collective_check h;
      P p;
    };
    // The same layout whether or not this exchange checks (a later exchange of the collective
    // carries an unread check): one runtime exchange per payload type, not two, in every
    // translation unit. The first exchange of a collective, the latency path's only one, checks.
    const detail::collective_header* const header = header_;
    header_ = nullptr;
    // The wait for the other replicas, on the timeline (docs/debugging.md#the-timeline).
    const detail::trace_phase waiting(header != nullptr ? "agreement check, waiting for peers" : "waiting for peers");
    const auto all =
        rt_->exchange(self_, with_check{header != nullptr ? detail::check_of(*header) : detail::collective_check{}, payload});
    static_assert(offsetof(with_check, h) == 0);
    if (header != nullptr) {
      const auto checks = all.template member<detail::collective_check>(0);
      if (!detail::agree(checks)) disagree(checks);
    }
    return all.template member<P>(offsetof(with_check, p));
  }

  /// A barrier: an exchange of nothing while the agreement check is still due, else the
  /// runtime's own barrier (no payload, no check).
  void barrier() {
    if (header_ != nullptr) {
      exchange(char{0});
    } else {
      const detail::trace_phase waiting("waiting for peers");
      rt_->barrier(self_);
    }
  }

  /// Runs `step`, a part of the collective that this replica makes for all of them (a policy's
  /// cross-worker step, made by one replica of each worker), so that what it throws is every
  /// replica's error: this replica rethrows it, and the others throw the same exception from the
  /// exchange or barrier they wait in, not `collective_cancelled_rethrow_me`. On a runtime that
  /// cannot publish an error (no `fail_collective`) the others are cancelled, as for any failure.
  template <class Step>
  void for_all_replicas(Step&& step) {
    const detail::trace_phase crossing("cross-worker step");
    detail::for_all_replicas(*rt_, static_cast<Step&&>(step));
  }

 private:
  // Out of exchange<P>: one copy per runtime, not one per payload type.
  [[noreturn, gnu::cold]] void disagree(const exchanged<detail::collective_check>& checks) {
    // Every replica sees the same checks, so all of them are here; none may unwind (and free
    // the headers and sizes the others read) before all have built the message.
    std::size_t first = 0;
    if constexpr (requires(const Rt& rt) { rt.first_replica(); }) first = static_cast<std::size_t>(rt_->first_replica());
    const detail::message text = detail::with_flight_record(detail::describe_disagreement(checks, first));
    rt_->barrier(self_);
    throw shape_error(text);
  }

  Rt* rt_;
  int self_;
  const detail::collective_header* header_;
  bool in_place_;
};

}  // namespace mirror::backend
