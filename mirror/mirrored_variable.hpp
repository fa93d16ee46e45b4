// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::MirroredVariable<T>`: state kept equal on every replica, synchronised on write.

#include <cstddef>
#include <mirror/source_location.hpp>
#include <span>
#include <tuple>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/access.hpp>
#include <mirror/detail/agreement_check.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/variable_value_checks.hpp>
#include <mirror/backend/cut_of.hpp>
#include <mirror/gradient_buckets.hpp>
#include <mirror/reduce_op.hpp>
#include <mirror/error.hpp>
#include <mirror/synced.hpp>
#include <mirror/variable_aggregation.hpp>

namespace mirror {

/// One copy of `T` per replica, always equal (TF's ON_WRITE `MirroredVariable`). Made by
/// `Strategy::make_variable(init, aggregation)`; every copy starts as `init`. `T` is a nest of
/// owning leaves: a whole model's parameters as one Hana struct is one variable, updated with
/// one fused all-reduce.
///
/// **Cross-replica context** (outside `run`, or in a `merge_call` function): `value()` reads
/// replica 0's copy; `assign`, `assign_add`, `assign_sub` and `update(fn, args...)` change every
/// copy. **Replica context**: passed to `run`, `fn` receives a `MirroredVariable<T>::handle`
/// (below) for its replica.
///
/// **Errors**: `shape_error` when a value's leaves differ in size from the variable's (nothing
/// is changed).
template <class T>
class MirroredVariable {
  static_assert(detail::variable_value_checks<T>::ok);

 public:
  using value_type = T;  ///< the type of each copy

  /// The variable as `fn` sees it on one replica, inside `run`.
  ///
  /// `assign(x)`, `assign_add(x)`, `assign_sub(x)` combine every replica's `x` with the
  /// variable's aggregation (`sum`, `mean`: an all-reduce through the strategy's ops;
  /// `only_first_replica`: replica 0's `x`) and apply the result once to every copy. With
  /// `VariableAggregation::none` they throw `aggregation_error` on every replica and change
  /// nothing (TF would silently update one copy and break the mirror).
  ///
  /// `update(fn, synced...)` calls `fn(T& copy, const U&...)` on this replica's copy, where every
  /// argument is a `Synced<U>` — equal on every replica by construction — so the copies stay
  /// equal with no further communication: the optimiser step after a gradient all-reduce.
  template <class Context>
  class handle {
   public:
    ///@{
    /// This replica's copy. `read()` is the same call under TensorFlow's other name
    /// (`read_value`): docs/guide.md\#variables.
    const T& value() const noexcept { return *copy_; }
    const T& read() const noexcept { return *copy_; }
    ///@}
    /// Combines every replica's `x` with the aggregation and sets every copy to the result.
    /// Collective: every replica calls it. **Errors**: `aggregation_error` (aggregation `none`),
    /// `shape_error` (leaf sizes differ); in both cases no copy changes.
    /// Like every collective, these take a last, defaulted call site that errors name.
    void assign(const T& x, mirror::source_location where = mirror::source_location::current()) {
      combine_and_apply(detail::update_kind::assign, x, "assign", where);
    }
    /// As `assign`, adding the combined value to every copy.
    void assign_add(const T& x, mirror::source_location where = mirror::source_location::current()) {
      combine_and_apply(detail::update_kind::add, x, "assign_add", where);
    }
    /// As `assign`, subtracting the combined value from every copy.
    void assign_sub(const T& x, mirror::source_location where = mirror::source_location::current()) {
      combine_and_apply(detail::update_kind::sub, x, "assign_sub", where);
    }

    /// Calls `fn(T& copy, const U&...)` on this replica's copy with the values of `args`, every
    /// one a `Synced<U>` (a compile error otherwise), so every replica applies the same step.
    template <class F, class... U>
    void update(F&& fn, const U&... args) {
      constexpr bool all_synced = (detail::is_synced<U>::value && ...);
      static_assert(all_synced,
                    "mirror::MirroredVariable::handle::update(fn, args...): every argument must be a "
                    "Synced<U> (from ctx.all_reduce, ctx.broadcast or ctx.merge_call), so that every "
                    "replica applies the same update; reduce per-replica values first");
      // Each mistake is one static_assert: the call is not compiled after either fails.
      if constexpr (all_synced) {
        constexpr bool callable = std::is_invocable_v<F&, T&, const typename U::value_type&...>;
        static_assert(callable,
                      "mirror::MirroredVariable::handle::update(fn, synced...): fn must be callable as "
                      "fn(T& copy, const U&... values), with T the variable's type (a std::vector<float> variable "
                      "takes std::vector<float>&, not another element type) and U the type inside each Synced<U>");
        if constexpr (callable) fn(*copy_, *args...);
      }
    }

    /// The sharded optimiser step (ZeRO stage 1), collective: every replica calls it with its own
    /// gradient. Afterwards every copy is equal again, as after `update`, but each replica has
    /// read and written only its own cut of the variable and of the optimiser state, so the
    /// state is kept once across replicas (1/N of it per replica) instead of N times.
    ///
    /// 1. `grads` (a nest of `std::span<E>` whose leaves of each element type match the
    ///    variable's, in order and length: this replica's gradient) is reduce-scattered with
    ///    `op` in place: this replica's cut r of every leaf holds the reduced gradient's cut r.
    /// 2. For every leaf, `step(std::span<E> param, std::span<const E> grad, std::span<E> state...)`
    ///    gets this replica's cut of its copy of the leaf, of the reduced gradient, and of each of
    ///    `states` (nests of `std::vector`, each holding only this replica's cut of every leaf:
    ///    `mirror::cut_for_replica`); element-wise optimisers (SGD, momentum, Adam) are one loop.
    /// 3. Every replica's cut of the variable is all-gathered in place into every copy.
    ///
    /// Cuts follow the batch-split rule (`ctx.reduce_scatter`), so any leaf length works.
    /// `op` carries the call site that errors name (a `ReduceOp` converts to it where it is
    /// passed: the states' pack leaves no room for a defaulted last parameter).
    /// **Errors**: `shape_error` before anything changes when a gradient or state leaf does not
    /// have the variable's length or this replica's cut of it. An exception from `step` on one
    /// replica leaves the copies unequal (others have applied theirs): rebuild the variable.
    /// **Communication**: a reduce_scatter of the gradient and an all_gather of the variable:
    /// the bytes of one all-reduce, with 1/N of the optimiser's work on each replica.
    template <class Step, class Grads, class... States>
    void update_sharded(Step&& step, detail::sited<ReduceOp> op, const Grads& grads, States&... states) {
      check_sharded("update_sharded", op.where, grads, states...);
      const Grads reduced = ctx_->reduce_scatter(op.value, grads, op.where);
      step_cuts(step, reduced, states...);
      ctx_->gather_cuts(*copy_, op.where);
    }

    /// `update_sharded` with a gradient already reduce-scattered during the backward pass:
    /// `buckets` (`ctx.gradient_buckets(op, grads, bytes, mirror::sharded)`, every leaf a
    /// `std::span`) is finished here, then steps 2 and 3 run as above. The same bits as
    /// `update_sharded(step, op, grads, states...)` where every bucket holds one leaf.
    /// **Errors**: as above, named at the `gradient_buckets` call; a `shape_error` leaves the
    /// variable as it was (the buckets already started complete as the object is destroyed);
    /// `mirror::error` when `buckets.finish()` was already called (this call finishes them).
    template <class Step, class Grads, class... States>
    void update_sharded(Step&& step, GradientBuckets<Grads, true>& buckets, States&... states) {
      static_assert([]<class... Ls>(detail::type_list<Ls...>) {
                      return (true && ... && leaf_traits<Ls>::is_view);
                    }(detail::leaf_types_t<Grads>{}),
                    "mirror::MirroredVariable::handle::update_sharded(step, buckets, states...): the buckets' "
                    "gradient leaves must be std::span views, whose cuts the step reads in place");
      if (buckets.finished()) {
        throw error(detail::format("%s: the buckets were already finished; pass them unfinished, as "
                                   "update_sharded finishes them",
                                   where("update_sharded", buckets.where()).c_str()));
      }
      check_sharded("update_sharded", buckets.where(), buckets.grads(), states...);
      const Grads reduced = buckets.finish();
      step_cuts(step, reduced, states...);
      ctx_->gather_cuts(*copy_, buckets.where());
    }

   private:
    /// update_sharded's shape checks, before anything changes: every gradient leaf has its
    /// variable leaf's length, every state leaf this replica's cut of it.
    template <class Grads, class... States>
    void check_sharded(const char* api, const mirror::source_location& at, const Grads& grads,
                       const States&... states) const {
      const int n = ctx_->num_replicas_in_sync(), r = ctx_->replica_id_in_sync_group();
      detail::for_each_type(detail::element_types_t<T>{}, [&]<class E>() {
        static_assert(detail::leaf_count<Grads, E>() == detail::leaf_count<T, E>() &&
                          ((detail::leaf_count<States, E>() == detail::leaf_count<T, E>()) && ...),
                      "mirror::MirroredVariable::handle::update_sharded: grads and every state must have as many "
                      "leaves of each element type as the variable, in the same order");
        auto params = detail::leaves_of<E>(*copy_);
        const auto g = detail::leaves_of<E>(grads);
        for (std::size_t j = 0; j < params.size(); ++j) {
          const std::size_t cut = backend::cut_of(params[j].size(), n, r).second;
          if (g[j].size() != params[j].size()) {
            throw shape_error(detail::format("%s: gradient leaf %zu has %zu elements but the variable's has %zu; "
                                             "pass the gradient of the whole variable",
                                             where(api, at).c_str(), j, g[j].size(), params[j].size()));
          }
          std::size_t index = 0;
          const auto check_state = [&](auto& state) {
            const auto s = detail::leaves_of<E>(state);
            if (s[j].size() != cut) {
              throw shape_error(detail::format("%s: state %zu leaf %zu has %zu elements but this replica's cut of "
                                               "the variable's leaf has %zu; make the state with "
                                               "mirror::cut_for_replica",
                                               where(api, at).c_str(), index, j, s[j].size(), cut));
            }
            ++index;
          };
          (check_state(states), ...);
          (void)check_state;  // (no states: an empty fold)
        }
      });
    }

    /// update_sharded's step 2: `step` on this replica's cut of every leaf.
    template <class Step, class Grads, class... States>
    void step_cuts(Step& step, const Grads& reduced, States&... states) {
      const int n = ctx_->num_replicas_in_sync(), r = ctx_->replica_id_in_sync_group();
      detail::for_each_type(detail::element_types_t<T>{}, [&]<class E>() {
        auto params = detail::leaves_of<E>(*copy_);
        const auto g = detail::leaves_of<E>(reduced);
        const auto s = std::tuple{detail::leaves_of<E>(states)...};
        for (std::size_t j = 0; j < params.size(); ++j) {
          // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
          const auto cut = backend::cut_of(params[j].size(), n, r);
          const std::span<E> mine = params[j].subspan(cut.first, cut.second);
          std::apply([&](const auto&... state) { step(mine, std::span<const E>(g[j]), state[j]...); }, s);
        }
      });
    }

    detail::message where(const char* api, const mirror::source_location& at) const {
      return detail::format("mirror::MirroredVariable::handle::%s at %s (replica %d)", api,
                            detail::site_text(at).c_str(), ctx_->replica_id_in_sync_group());
    }

    handle(T& copy, VariableAggregation aggregation, Context& ctx) noexcept
        : copy_(&copy), aggregation_(aggregation), ctx_(&ctx) {}
    friend class MirroredVariable;

    void combine_and_apply(detail::update_kind kind, const T& x, const char* api, const mirror::source_location& at) {
      const std::string where = std::string("mirror::MirroredVariable::") + api + " at " +
                                detail::site_text(at).c_str() + " (replica " +
                                std::to_string(ctx_->replica_id_in_sync_group()) + ")";
      switch (aggregation_) {
        case VariableAggregation::none:
          throw aggregation_error(detail::format("%s: the variable's aggregation is none, so the replicas' values "
                                                 "cannot be combined; create it with VariableAggregation::sum, mean "
                                                 "or only_first_replica, update it outside run, or use update(fn, "
                                                 "synced...)",
                                                 where.c_str()));
        case VariableAggregation::sum: finish(kind, *ctx_->all_reduce(ReduceOp::sum, x, at), where); return;
        case VariableAggregation::mean: finish(kind, *ctx_->all_reduce(ReduceOp::mean, x, at), where); return;
        case VariableAggregation::only_first_replica: finish(kind, *ctx_->broadcast(x, 0, at), where); return;
      }
    }
    void finish(detail::update_kind kind, const T& combined, const std::string& where) {
      detail::require_same_shape(*copy_, combined, where);  // every replica sees the same value
      detail::apply_update(kind, *copy_, combined);
    }

    T* copy_;
    VariableAggregation aggregation_;
    Context* ctx_;
  };

  /// How updates in replica context are combined.
  VariableAggregation aggregation() const noexcept { return aggregation_; }
  ///@{
  /// Replica 0's copy (all copies are equal).
  const T& value() const noexcept { return copies_.front(); }
  const T& read() const noexcept { return copies_.front(); }
  ///@}

  /// Sets every copy to `x`.
  void assign(const T& x) { update_all(detail::update_kind::assign, x, "assign"); }
  /// Adds `x` to every copy.
  void assign_add(const T& x) { update_all(detail::update_kind::add, x, "assign_add"); }
  /// Subtracts `x` from every copy.
  void assign_sub(const T& x) { update_all(detail::update_kind::sub, x, "assign_sub"); }
  /// Calls `fn(T& copy, args...)` on every copy, in replica order.
  template <class F, class... A>
  void update(F&& fn, const A&... args) {
    for (T& c : copies_) fn(c, args...);
  }

  ///@{
  /// The copies, in replica order (also `Strategy::local_results(variable)`).
  std::size_t size() const noexcept { return copies_.size(); }
  const T& operator[](std::size_t i) const noexcept { return copies_[i]; }
  auto begin() const noexcept { return copies_.cbegin(); }
  auto end() const noexcept { return copies_.cend(); }
  ///@}

 private:
  // The handle replica `r` receives in `run` (Strategy's, through detail::access).
  template <class Context>
  handle<Context> handle_for(int r, Context& ctx) noexcept {
    return handle<Context>(copies_[static_cast<std::size_t>(r)], aggregation_, ctx);
  }
  MirroredVariable(const T& init, int replicas, VariableAggregation aggregation)
      : copies_(static_cast<std::size_t>(replicas), init), aggregation_(aggregation) {
    if constexpr (!detail::all_leaves_floating<T>()) {
      if (aggregation == VariableAggregation::mean) {
        throw aggregation_error(
            "mirror::Strategy::make_variable: VariableAggregation::mean needs floating-point leaves (an integer "
            "mean would truncate every update); use sum, only_first_replica, or a floating-point type");
      }
    }
  }
  friend struct detail::access;

  void update_all(detail::update_kind kind, const T& x, const char* api) {
    detail::require_same_shape(copies_.front(), x, std::string("mirror::MirroredVariable::") + api);
    for (T& c : copies_) detail::apply_update(kind, c, x);
  }

  std::vector<T> copies_;
  VariableAggregation aggregation_;
};

}  // namespace mirror
