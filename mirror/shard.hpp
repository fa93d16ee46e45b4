// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::shard(range, ctx)`: this input pipeline's share of a range (TF's `Dataset.shard`).

#include <cstddef>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <utility>
#include <mirror/detail/format.hpp>
#include <mirror/detail/lean_ranges.hpp>  // <ranges>: the parts used
#include <mirror/input_context.hpp>

namespace mirror {

/// The elements of a range whose index i satisfies `i % count == index`, lazily, in order.
template <std::ranges::input_range V>
  requires std::ranges::view<V>
class shard_view : public std::ranges::view_interface<shard_view<V>> {
 public:
  shard_view() = default;  ///< an empty shard
  /// The elements of `base` whose index i has `i % count == index`.
  shard_view(V base, int count, int index) : base_(std::move(base)), count_(count), index_(index) {}

  /// An input iterator over the shard's elements.
  class iterator {
   public:
    ///@{
    /// The input-iterator interface.
    using value_type = std::ranges::range_value_t<V>;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    decltype(auto) operator*() const { return *it_; }
    iterator& operator++() {
      skip(count_);
      return *this;
    }
    void operator++(int) { ++*this; }
    ///@}
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return i.it_ == i.end_; }

   private:
    friend class shard_view;
    iterator(std::ranges::iterator_t<V> it, std::ranges::sentinel_t<V> end, int count, int index)
        : it_(std::move(it)), end_(std::move(end)), count_(count) {
      skip(index);
    }
    // Advances n elements, stopping at the end (the last shard may be shorter).
    void skip(int n) {
      for (int i = 0; i < n && it_ != end_; ++i) ++it_;
    }
    std::ranges::iterator_t<V> it_{};
    std::ranges::sentinel_t<V> end_{};
    int count_ = 1;
  };

  ///@{
  /// The shard's elements, in the base range's order.
  iterator begin() { return iterator(std::ranges::begin(base_), std::ranges::end(base_), count_, index_); }
  std::default_sentinel_t end() const noexcept { return {}; }
  ///@}

 private:
  V base_{};
  int count_ = 1, index_ = 0;
};

/// This input pipeline's share of `range` for `distribute_datasets_from_function`: elements
/// `ctx.input_pipeline_id`, `+ ctx.num_input_pipelines`, ... (TF's
/// `dataset.shard(num_input_pipelines, input_pipeline_id)`). With 2 workers, `[0, 1, ..., 6]`
/// gives worker 0 `[0, 2, 4, 6]` and worker 1 `[1, 3, 5]`; shard before batching so that every
/// worker's batches hold whole elements.
///
/// **Errors**: `std::invalid_argument` for a context with `num_input_pipelines < 1` or an id out
/// of range.
template <std::ranges::viewable_range R>
auto shard(R&& range, const InputContext& ctx) {
  if (ctx.num_input_pipelines < 1 || ctx.input_pipeline_id < 0 || ctx.input_pipeline_id >= ctx.num_input_pipelines) {
    throw std::invalid_argument(detail::format("mirror::shard(range, ctx): ctx has input_pipeline_id = %d of "
                                               "num_input_pipelines = %d; pass the InputContext that "
                                               "distribute_datasets_from_function gave",
                                               ctx.input_pipeline_id, ctx.num_input_pipelines)
                                    .c_str());
  }
  using V = detail::all_t<R>;
  return shard_view<V>(detail::all(std::forward<R>(range)), ctx.num_input_pipelines, ctx.input_pipeline_id);
}

}  // namespace mirror
