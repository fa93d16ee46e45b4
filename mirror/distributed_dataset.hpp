// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::DistributedDataset`: global batches split over replicas (`Strategy::distribute_dataset`),
/// and `mirror::DatasetsFromFunction` (`Strategy::distribute_datasets_from_function`).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <atomic>
#include <cstddef>
#include <exception>
#include <iterator>
#include <optional>
#include <semaphore>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <boost/hana/accessors.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/lean_ranges.hpp>  // <ranges>: the parts used
#include <mirror/detail/nest_walk.hpp>
#include <mirror/backend/cut_of.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/error.hpp>
#include <mirror/input_context.hpp>
#include <mirror/matrix.hpp>
#include <mirror/per_replica.hpp>

namespace mirror {

/// Options of `Strategy::distribute_dataset`.
struct InputOptions {
  /// Global batches the range is read ahead by, on a background thread (0: none). Use it when
  /// producing a batch costs time (decoding, shuffling, a lazy view); the queue holds at most
  /// this many batches.
  int prefetch = 0;
  friend bool operator==(const InputOptions&, const InputOptions&) = default;
};

namespace detail {

// ---- batch leaves: things with a leading (row) dimension, and their views ----
template <class L>
struct batch_leaf : std::false_type {};
template <class E, class A>
struct batch_leaf<std::vector<E, A>> : std::true_type {
  using view = std::span<const E>;
  static std::size_t rows(const std::vector<E, A>& x) noexcept { return x.size(); }
  static view slice(const std::vector<E, A>& x, std::size_t first, std::size_t n) noexcept {
    return view(x).subspan(first, n);
  }
};
template <class E, std::size_t X>
struct batch_leaf<std::span<E, X>> : std::true_type {
  using view = std::span<E>;
  static std::size_t rows(const std::span<E, X>& x) noexcept { return x.size(); }
  static view slice(const std::span<E, X>& x, std::size_t first, std::size_t n) noexcept {
    return view(x).subspan(first, n);
  }
};
template <class E>
struct batch_leaf<matrix<E>> : std::true_type {
  using view = matrix_view<const E>;
  static std::size_t rows(const matrix<E>& x) noexcept { return x.rows(); }
  static view slice(const matrix<E>& x, std::size_t first, std::size_t n) noexcept {
    return x.view().subrows(first, n);
  }
};
template <class E>
struct batch_leaf<matrix_view<E>> : std::true_type {
  using view = matrix_view<E>;
  static std::size_t rows(const matrix_view<E>& x) noexcept { return x.rows(); }
  static view slice(const matrix_view<E>& x, std::size_t first, std::size_t n) noexcept {
    return x.subrows(first, n);
  }
};

/// The per-replica type of a global batch type: each leaf becomes its view.
template <class T>
struct batch_view {
  static auto pick() {
    if constexpr (batch_leaf<T>::value) {
      return std::type_identity<typename batch_leaf<T>::view>{};
    } else if constexpr (is_hana_struct<T>) {
      return std::type_identity<T>{};  // members must already be views (checked in is_batch)
    } else if constexpr (is_std_tuple_like<T>::value) {
      return []<template <class...> class Tpl, class... Ts>(std::type_identity<Tpl<Ts...>>) {
        return std::type_identity<Tpl<typename batch_view<Ts>::type...>>{};
      }(std::type_identity<T>{});
    } else {
      return std::type_identity<void>{};
    }
  }
  using type = typename decltype(pick())::type;
};
template <class E, std::size_t N>
struct batch_view<std::array<E, N>> {
  using type = std::array<typename batch_view<E>::type, N>;
};
template <class T>
using batch_view_t = typename batch_view<T>::type;

template <class T>
consteval bool is_batch() {
  if constexpr (batch_leaf<T>::value) {
    return true;
  } else if constexpr (is_hana_struct<T>) {
    bool ok = true;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      using M = std::remove_cvref_t<decltype(boost::hana::second(pair)(std::declval<T&>()))>;
      ok = ok && is_batch<M>() && std::is_same_v<batch_view_t<M>, M>;
    });
    return ok;
  } else if constexpr (is_std_tuple_like<T>::value) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (true && ... && is_batch<std::remove_cvref_t<std::tuple_element_t<I, T>>>());
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else {
    return false;
  }
}

/// Calls f(leaf_of_batch, leaf_of_view) over a batch and its view, in lockstep.
template <class F, class B, class V>
void for_each_batch_leaf(F&& f, const B& batch, V& view) {
  if constexpr (batch_leaf<B>::value) {
    f(batch, view);
  } else if constexpr (is_hana_struct<B>) {
    boost::hana::for_each(boost::hana::accessors<B>(), [&](auto pair) {
      auto get = boost::hana::second(pair);
      for_each_batch_leaf(f, get(batch), get(view));
    });
  } else {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (for_each_batch_leaf(f, std::get<I>(batch), std::get<I>(view)), ...);
    }(std::make_index_sequence<std::tuple_size_v<B>>{});
  }
}

/// The rows of a global batch; every leaf must have the same number.
template <class B>
std::size_t batch_rows(const B& batch) {
  std::optional<std::size_t> rows;
  std::size_t k = 0;
  auto scratch = batch_view_t<B>{};
  for_each_batch_leaf(
      [&](const auto& leaf, auto&) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        if constexpr (requires { leaf.cols; }) {
          // A matrix's rows() drops a partial last row: refuse it rather than lose elements.
          const std::size_t elements = leaf.data.size();
          if (leaf.cols == 0 ? elements != 0 : elements % leaf.cols != 0) {
            throw shape_error(detail::format("mirror::Strategy::distribute_dataset: leaf %zu (%s) of a global batch "
                                             "holds %zu elements in %zu columns, which is not a whole number of "
                                             "rows; make its element count a multiple of cols",
                                             k, type_name<L>().c_str(), elements, leaf.cols));
          }
        }
        const std::size_t n = batch_leaf<L>::rows(leaf);
        if (rows && *rows != n) {
          throw shape_error(detail::format("mirror::Strategy::distribute_dataset: leaf %zu (%s) of a global batch "
                                           "has %zu rows but leaf 0 has %zu; every leaf of a batch needs the same "
                                           "leading dimension",
                                           k, type_name<L>().c_str(), n, *rows));
        }
        rows = n;
        ++k;
      },
      batch, scratch);
  return rows.value_or(0);
}

/// Replica r's share of a global batch of G rows (views into it: no copy).
template <class B>
batch_view_t<B> split_batch(const B& batch, std::size_t global, int replicas, int r) {
  // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
  const auto rows = backend::cut_of(global, replicas, r);
  const std::size_t first = rows.first, count = rows.second;
  batch_view_t<B> view{};
  for_each_batch_leaf(
      [&](const auto& leaf, auto& out) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        out = batch_leaf<L>::slice(leaf, first, count);
      },
      batch, view);
  return view;
}

/// The input-iterator interface of both dataset ranges: Derived::advance() computes the next
/// step into `current_` (left empty at the end).
template <class Derived, class Value>
class step_iterator {
 public:
  using value_type = Value;
  using difference_type = std::ptrdiff_t;
  const Value& operator*() const { return *current_; }
  const Value* operator->() const { return &*current_; }
  Derived& operator++() {
    static_cast<Derived*>(this)->advance();
    return static_cast<Derived&>(*this);
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const Derived& it, std::default_sentinel_t) noexcept {
    return !static_cast<const step_iterator&>(it).current_;
  }

 protected:
  std::optional<Value> current_;
};

/// A bounded queue filled by a background thread reading a range ahead (InputOptions::prefetch):
/// a ring of `depth` slots with one producer and one consumer, handed back and forth by two
/// semaphores (free slots, filled slots), so neither side takes a lock. (No <deque> and no
/// <condition_variable>: docs/design.md\#compile-time.)
template <class Value>
class prefetcher {
 public:
  template <class Range>
  prefetcher(Range& range, std::size_t depth)
      : depth_(depth), ring_(depth), free_(static_cast<std::ptrdiff_t>(depth)), filled_(0) {
    thread_ = std::thread([this, &range] {
      std::size_t tail = 0;  // the producer's own index: the slot it fills next
      try {
        for (auto&& item : range) {
          free_.acquire();  // a slot the consumer has emptied, or the destructor's wake-up
          if (stop_.load(std::memory_order_acquire)) return;
          std::optional<Value>& slot = ring_[tail];
          if constexpr (std::is_pointer_v<Value>) {
            slot.emplace(&item);  // lvalue elements stay where they are
          } else {
            slot.emplace(std::forward<decltype(item)>(item));
          }
          tail = (tail + 1) % depth_;
          filled_.release();  // publishes the slot (release: its contents happen before the take)
        }
      } catch (...) {
        failure_ = std::current_exception();  // published by the release below
      }
      // The end: a release with no item behind it. The consumer's next slot stays empty.
      filled_.release();
    });
  }
  prefetcher(const prefetcher&) = delete;
  prefetcher& operator=(const prefetcher&) = delete;
  ~prefetcher() {
    stop_.store(true, std::memory_order_release);
    free_.release();  // a producer waiting for a slot wakes, sees stop_ and returns
    thread_.join();
  }
  /// The next item, or nothing at the end; rethrows what the range threw.
  std::optional<Value> next() {
    if (ended_) return end();
    filled_.acquire();
    std::optional<Value>& slot = ring_[head_];
    if (!slot) {  // the producer's end marker: every item before it was taken
      ended_ = true;
      return end();
    }
    std::optional<Value> v(std::move(slot));
    slot.reset();
    head_ = (head_ + 1) % depth_;
    free_.release();
    return v;
  }

 private:
  std::optional<Value> end() const {
    if (failure_) std::rethrow_exception(failure_);
    return std::nullopt;
  }

  std::size_t depth_;
  std::vector<std::optional<Value>> ring_;  // filled from the producer's tail, emptied from head_
  std::counting_semaphore<> free_, filled_;
  std::size_t head_ = 0;  // the consumer's index: the slot it takes next
  bool ended_ = false;    // the consumer has seen the end marker
  std::atomic<bool> stop_{false};
  std::exception_ptr failure_;  // written by the producer before its last release
  std::thread thread_;
};

}  // namespace detail

/// The range `Strategy::distribute_dataset(global_batches)` returns. Each element is a
/// `PerReplica` of the per-replica views of one global batch (TF's split rule: of G rows, the
/// first G mod R replicas get one more; a ragged last batch by the same rule on its own size;
/// replicas left without rows get empty views). Iteration ends with the range, or at a global
/// batch with no rows. An input range: iterate it once.
///
/// **Multi-worker** (N = W*R): every worker iterates the same global batches and keeps the
/// parts of its global replicas w*R .. w*R+R-1 (contiguous, by the rule above with N). No
/// communication per step: a sized range has its size compared across workers once, when
/// iteration starts (a mismatch is a `shape_error` on every worker, never a hang); an unsized
/// one all-reduces "has a batch" each step, so every worker stops together and a worker whose
/// range ended early gives its replicas empty batches.
template <class Range>
class DistributedDataset {
  using batch_type = std::remove_cvref_t<std::ranges::range_reference_t<Range>>;
  static_assert(detail::is_batch<batch_type>(),
                "mirror::Strategy::distribute_dataset(global_batches): each global batch must be a batch leaf "
                "(std::vector<E>, std::span<E>, mirror::matrix<E>, mirror::matrix_view<E>) or a std::tuple, "
                "std::pair or std::array of them, or a Hana struct whose members are views (std::span<const E>, "
                "mirror::matrix_view<const E>)");
  // Lvalue elements are viewed where they are; prvalue elements (a lazy view) are held.
  static constexpr bool holds = !std::is_lvalue_reference_v<std::ranges::range_reference_t<Range>>;
  using held_type = std::conditional_t<holds, batch_type, const batch_type*>;

 public:
  /// What each step yields: replica r's rows of the global batch (views where they can be).
  using value_type = PerReplica<detail::batch_view_t<batch_type>>;

  /// Made by `Strategy::distribute_dataset`; `first_replica`, `local_replicas` and `group` place
  /// this worker's replicas among the global ones (multi-worker).
  DistributedDataset(Range range, int replicas, InputOptions options, int first_replica = 0, int local_replicas = -1,
                     detail::worker_group* group = nullptr)
      : range_(std::move(range)),
        replicas_(replicas),
        options_(options),
        first_(first_replica),
        local_(local_replicas < 0 ? replicas : local_replicas),
        group_(group) {}

  /// An input iterator over the steps; `*it` is the step's `value_type`.
  class iterator : public detail::step_iterator<iterator, value_type> {
   public:
    iterator() = default;  ///< a past-the-end iterator

   private:
    friend class DistributedDataset;
    explicit iterator(DistributedDataset* d) : d_(d) {
      if constexpr (std::ranges::sized_range<Range>) {
        if (d_->group_ != nullptr) {
          const auto n = static_cast<std::int64_t>(std::ranges::size(d_->range_));
          detail::require_equal_across_workers(
              *d_->group_, n, "mirror::Strategy::distribute_dataset", [&](std::int64_t most, std::int64_t least) {
                throw shape_error(detail::format("mirror::Strategy::distribute_dataset: the workers' ranges of "
                                                 "global batches differ in size (between %lld and %lld batches; "
                                                 "worker %d has %lld); every worker must iterate the same global "
                                                 "batches (same source, same seed)",
                                                 static_cast<long long>(least), static_cast<long long>(most),
                                                 d_->group_->worker_index(), static_cast<long long>(n)));
              });
        }
      }
      if (d_->options_.prefetch > 0) {
        prefetch_ = std::make_unique<detail::prefetcher<held_type>>(d_->range_, static_cast<std::size_t>(d_->options_.prefetch));
      } else {
        it_ = std::ranges::begin(d_->range_);
      }
      advance();
    }
    std::optional<held_type> pull() {
      if (exhausted_) return std::nullopt;
      if (prefetch_) return prefetch_->next();
      if (*it_ == std::ranges::end(d_->range_)) return std::nullopt;
      std::optional<held_type> v;
      if constexpr (holds) {
        v.emplace(**it_);
      } else {
        v.emplace(&**it_);
      }
      ++*it_;
      return v;
    }
    void advance() {
      this->current_.reset();
      held_ = pull();
      std::size_t rows = held_ ? detail::batch_rows(deref(*held_)) : 0;
      if (rows == 0) {
        held_.reset();
        exhausted_ = true;
      }
      if (!std::ranges::sized_range<Range> && d_->group_ != nullptr) {
        // Unsized: the workers agree each step whether anyone still has a batch.
        std::int64_t have = held_ ? 1 : 0;
        d_->group_->all_reduce(&have, 1, detail::element_kind_of<std::int64_t>(), ReduceOp::sum,
                               "mirror::DistributedDataset (has-data step)");
        if (have == 0) return;
      } else if (!held_) {
        return;
      }
      std::vector<detail::batch_view_t<batch_type>> parts;
      parts.reserve(static_cast<std::size_t>(d_->local_));
      for (int r = 0; r < d_->local_; ++r) {
        parts.push_back(held_ ? detail::split_batch(deref(*held_), rows, d_->replicas_, d_->first_ + r)
                              : detail::batch_view_t<batch_type>{});
      }
      this->current_.emplace(std::move(parts));
    }
    static const batch_type& deref(const held_type& h) {
      if constexpr (holds) {
        return h;
      } else {
        return *h;
      }
    }

    friend detail::step_iterator<iterator, value_type>;
    DistributedDataset* d_ = nullptr;
    std::optional<std::ranges::iterator_t<Range>> it_;
    std::unique_ptr<detail::prefetcher<held_type>> prefetch_;
    std::optional<held_type> held_;
    bool exhausted_ = false;
  };

  ///@{
  /// The steps (a single-pass range: each `begin()` starts a pass over the underlying range).
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const noexcept { return {}; }
  ///@}

 private:
  Range range_;
  int replicas_;  // in sync (all workers)
  InputOptions options_;
  int first_;     // global id of this worker's replica 0
  int local_;     // replicas in this process
  detail::worker_group* group_;
};

/// The range `Strategy::distribute_datasets_from_function(fn)` returns: each step, every replica
/// dequeues one batch from the function's range, in replica order; when the range runs out
/// mid-step, the remaining replicas get an empty (value-initialised) batch, and iteration ends
/// at the first step where no replica gets one. Multi-worker: "no replica" means no replica of
/// any worker — the count is all-reduced each step (TF's has-data rule), so ragged per-worker
/// data ends every worker at the same step.
template <class Range>
class DatasetsFromFunction {
 public:
  using batch_type = std::ranges::range_value_t<Range>;  ///< one replica's batch, as the range yields it
  using value_type = PerReplica<batch_type>;             ///< one step: a batch per replica

  /// Made by `Strategy::distribute_datasets_from_function`.
  DatasetsFromFunction(Range range, int replicas, detail::worker_group* group = nullptr)
      : range_(std::move(range)), replicas_(replicas), group_(group) {}

  /// An input iterator over the steps; `*it` is the step's `value_type`.
  class iterator : public detail::step_iterator<iterator, value_type> {
   public:
    iterator() = default;  ///< a past-the-end iterator

   private:
    friend class DatasetsFromFunction;
    explicit iterator(DatasetsFromFunction* d) : d_(d), it_(std::ranges::begin(d->range_)) { advance(); }
    void advance() {
      this->current_.reset();
      std::vector<batch_type> parts;
      parts.reserve(static_cast<std::size_t>(d_->replicas_));
      bool any = false;
      for (int r = 0; r < d_->replicas_; ++r) {
        if (*it_ != std::ranges::end(d_->range_)) {
          parts.push_back(**it_);
          ++*it_;
          any = true;
        } else {
          parts.push_back(batch_type{});
        }
      }
      if (d_->group_ != nullptr) {
        std::int64_t have = any ? 1 : 0;
        d_->group_->all_reduce(&have, 1, detail::element_kind_of<std::int64_t>(), ReduceOp::sum,
                               "mirror::DatasetsFromFunction (has-data step)");
        any = have > 0;
      }
      if (any) this->current_.emplace(std::move(parts));
    }
    friend detail::step_iterator<iterator, value_type>;
    DatasetsFromFunction* d_ = nullptr;
    std::optional<std::ranges::iterator_t<Range>> it_;
  };

  ///@{
  /// The steps (a single-pass range).
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const noexcept { return {}; }
  ///@}

 private:
  Range range_;
  int replicas_;  // in this process
  detail::worker_group* group_;
};

}  // namespace mirror
