// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::cut_for_replica`: one replica's cut of a nest, by the rule `reduce_scatter` uses.

#include <cstddef>
#include <type_traits>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/backend/cut_of.hpp>
#include <mirror/leaf_traits.hpp>
#include <mirror/value_context.hpp>

namespace mirror {

/// `value` with each leaf replaced by the cut replica `c.replica_id_in_sync_group` of
/// `c.num_replicas_in_sync` receives from `ctx.reduce_scatter` (the first n mod N replicas one
/// element more): the shard of optimiser state a replica keeps for
/// `MirroredVariable::handle::update_sharded`. Made once per replica with
/// `strategy.distribute_values_from_function`:
/// \code
/// auto velocity = strategy.distribute_values_from_function(
///     [&](const mirror::ValueContext& c) { return mirror::cut_for_replica(zeros, c); });
/// \endcode
/// **Requires**: every leaf is a `std::vector` (a cut of any length; a compile error otherwise).
template <nest T>
T cut_for_replica(const T& value, const ValueContext& c) {
  static_assert([]<class... Ls>(detail::type_list<Ls...>) {
                  return (true && ... && (leaf_traits<Ls>::rank == 1 && leaf_traits<Ls>::resizable));
                }(detail::leaf_types_t<T>{}),
                "mirror::cut_for_replica(value, c): every leaf must be a std::vector, which holds a cut of any "
                "length (the optimiser state of a std::vector leaf of the variable)");
  T out(value);
  detail::for_each_leaf(
      [&](auto& leaf) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        const auto elements = leaf_traits<L>::elements(leaf);
        const auto [first, count] = backend::cut_of(elements.size(), c.num_replicas_in_sync, c.replica_id_in_sync_group);
        for (std::size_t i = 0; i < count; ++i) elements[i] = elements[first + i];
        leaf_traits<L>::resize(leaf, count);
      },
      out);
  return out;
}

}  // namespace mirror
