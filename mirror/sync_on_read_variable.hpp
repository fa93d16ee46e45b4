// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::SyncOnReadVariable<T>`: per-replica state, aggregated when read across replicas.

#include <cstddef>
#include <mirror/source_location.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/access.hpp>
#include <mirror/detail/agreement_check.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/host_reduce.hpp>
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/variable_value_checks.hpp>
#include <mirror/error.hpp>
#include <mirror/variable_aggregation.hpp>

namespace mirror {

/// One copy of `T` per replica that each replica writes on its own (TF's ON_READ variable:
/// metrics, batch-norm statistics). Made by `Strategy::make_sync_on_read_variable(init,
/// aggregation)`; every copy starts as `init`.
///
/// **Replica context**: the handle `fn` receives reads and writes only its replica's copy, with
/// no communication. **Cross-replica context**: `value()` aggregates the copies (`sum`, `mean`:
/// reduced in replica order; `only_first_replica`: replica 0's copy; `none`:
/// `aggregation_error`). `assign(v)` stores `v / N` in each copy for `sum` (so the summed read
/// gives `v`) and `v` otherwise; `assign_add` / `assign_sub` change every copy, and are an
/// `aggregation_error` for `sum` (TF's rule: the read would change by N times the value).
///
/// **Multi-worker** (`devices::Cluster`): N = W*R; `value()` combines every worker's copies and
/// `only_first_replica` reads global replica 0 (the chief's first copy), so `value()` is a
/// collective that every worker calls in the same order.
template <class T>
class SyncOnReadVariable {
  static_assert(detail::variable_value_checks<T>::ok);

 public:
  using value_type = T;  ///< the type of each copy

  /// The variable as `fn` sees it on one replica: its own copy, read and written locally.
  class handle {
   public:
    ///@{
    /// This replica's copy (no communication). `read()` is the same call under TensorFlow's
    /// other name (`read_value`): docs/guide.md\#variables.
    const T& value() const noexcept { return *copy_; }
    const T& read() const noexcept { return *copy_; }
    ///@}
    /// Sets this replica's copy to `x`. **Errors**: `shape_error` when `x`'s leaves differ in
    /// size from the copy's (nothing changes).
    void assign(const T& x) { apply(detail::update_kind::assign, x, "assign"); }
    /// Adds `x` to this replica's copy, element-wise (errors as `assign`).
    void assign_add(const T& x) { apply(detail::update_kind::add, x, "assign_add"); }
    /// Subtracts `x` from this replica's copy, element-wise (errors as `assign`).
    void assign_sub(const T& x) { apply(detail::update_kind::sub, x, "assign_sub"); }

   private:
    explicit handle(T& copy) noexcept : copy_(&copy) {}
    friend class SyncOnReadVariable;
    void apply(detail::update_kind kind, const T& x, const char* api) {
      detail::require_same_shape(*copy_, x, std::string("mirror::SyncOnReadVariable::handle::") + api);
      detail::apply_update(kind, *copy_, x);
    }
    T* copy_;
  };

  /// How a cross-replica read combines the copies.
  VariableAggregation aggregation() const noexcept { return aggregation_; }

  /// The aggregated value (see the class comment). Multi-worker: collective; `where`, left
  /// out by callers, is the call site that a cross-worker error names.
  T value(mirror::source_location where = mirror::source_location::current()) const {
    const detail::at_call_site site(where);
    switch (aggregation_) {
      case VariableAggregation::none:
        throw aggregation_error(
            "mirror::SyncOnReadVariable::value in cross-replica context: the aggregation is none, so the "
            "copies cannot be combined; create it with sum, mean or only_first_replica, or read the copies "
            "with local_results");
      case VariableAggregation::only_first_replica: {
        T first = copies_.front();
        if (group_ != nullptr) detail::broadcast_nest(*group_, first, 0, "mirror::SyncOnReadVariable::value");
        return first;
      }
      case VariableAggregation::sum: return reduced(ReduceOp::sum);
      case VariableAggregation::mean: return reduced(ReduceOp::mean);
    }
    return copies_.front();
  }
  /// Same as `value()`.
  T read(mirror::source_location where = mirror::source_location::current()) const { return value(where); }

  /// Sets every copy so that the aggregated read gives `v`: `v / N` in each copy for `sum`
  /// (TF's rule), `v` for the other aggregations. **Errors**: `shape_error` when `v`'s leaves
  /// differ in size from the copies' (nothing changes).
  void assign(const T& v) {
    detail::require_same_shape(copies_.front(), v, "mirror::SyncOnReadVariable::assign");
    T each = v;
    if (aggregation_ == VariableAggregation::sum) detail::divide_leaves(each, replicas_in_sync());
    for (T& c : copies_) detail::apply_update(detail::update_kind::assign, c, each);
  }
  /// Adds `v` to every copy. **Errors**: `aggregation_error` for a `sum` variable (the read
  /// would grow by N times `v`; TF refuses it too), `shape_error` as `assign`.
  void assign_add(const T& v) { add_to_all(detail::update_kind::add, v, "assign_add"); }
  /// Subtracts `v` from every copy (errors as `assign_add`).
  void assign_sub(const T& v) { add_to_all(detail::update_kind::sub, v, "assign_sub"); }

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
  handle handle_for(int r, Context&) noexcept {
    return handle(copies_[static_cast<std::size_t>(r)]);
  }
  SyncOnReadVariable(const T& init, int replicas, VariableAggregation aggregation,
                     detail::worker_group* group = nullptr)
      : copies_(static_cast<std::size_t>(replicas), init), aggregation_(aggregation), group_(group) {}
  friend struct detail::access;

  std::size_t replicas_in_sync() const noexcept {
    return copies_.size() * static_cast<std::size_t>(group_ != nullptr ? group_->num_workers() : 1);
  }

  T reduced(ReduceOp op) const {
    T out = copies_.front();
    detail::reduce_components(detail::cross_op(op), std::span<const T>(copies_), out, detail::serial_parallel(),
                              "SyncOnReadVariable::value");
    if (group_ != nullptr) {
      detail::all_reduce_nest(*group_, out, op, replicas_in_sync(), "mirror::SyncOnReadVariable::value");
    } else if (op == ReduceOp::mean) {
      detail::divide_leaves(out, copies_.size());
    }
    return out;
  }
  void add_to_all(detail::update_kind kind, const T& v, const char* api) {
    if (aggregation_ == VariableAggregation::sum) {
      throw aggregation_error(std::string("mirror::SyncOnReadVariable::") + api +
                              " in cross-replica context with VariableAggregation::sum: the summed read would "
                              "change by N times the value; use assign, or update the copies inside run");
    }
    detail::require_same_shape(copies_.front(), v, std::string("mirror::SyncOnReadVariable::") + api);
    for (T& c : copies_) detail::apply_update(kind, c, v);
  }

  std::vector<T> copies_;
  VariableAggregation aggregation_;
  detail::worker_group* group_;  // null in one process
};

}  // namespace mirror
