// SPDX-License-Identifier: Apache-2.0
#pragma once
// How Strategy::run types its result: T → PerReplica<T>, Synced<T> → Mirrored<T>, and a tuple
// (std::tuple, std::pair, boost::hana::tuple) element by element.

#include <boost/hana/at.hpp>
#include <boost/hana/tuple.hpp>
#include <cstddef>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>
#include <mirror/detail/access.hpp>

namespace mirror::detail {

template <class T>
struct lift_one {
  using type = PerReplica<T>;
  static type make(std::vector<T>&& v) { return type(std::move(v)); }
};
template <class T>
struct lift_one<Synced<T>> {
  using type = Mirrored<T>;
  static type make(std::vector<Synced<T>>&& v) {
    replica_builder<T> copies(v.size());
    for (std::size_t r = 0; r < v.size(); ++r) copies.build(static_cast<int>(r), access::unwrap(std::move(v[r])));
    return access::mirrored(std::move(copies).finish());
  }
};

/// What run builds its result with: `collector(n)`, then `take(r, result)` on each replica
/// (concurrently, each r once), then `finish()` once all took theirs.
///
/// A plain T: each replica's result is built in its final place in the PerReplica<T>.
template <class R>
struct run_result : lift_one<R> {
  class collector {
   public:
    explicit collector(std::size_t n) : out_(n) {}
    template <class V>  // R, or a reference to one (fn may return a reference)
    void take(int r, V&& value) {
      out_.build(r, std::forward<V>(value));
    }
    PerReplica<R> finish() && { return access::per_replica(std::move(out_).finish()); }

   private:
    replica_builder<R> out_;
  };
};

/// Synced<T>: the value is unwrapped into its place in the Mirrored<T>.
template <class T>
struct run_result<Synced<T>> {
  using type = Mirrored<T>;
  class collector {
   public:
    explicit collector(std::size_t n) : out_(n) {}
    template <class V>
    void take(int r, V&& value) {
      if constexpr (std::is_lvalue_reference_v<V>) {
        out_.build(r, value.get());
      } else {
        out_.build(r, access::unwrap(std::move(value)));
      }
    }
    Mirrored<T> finish() && { return access::mirrored(std::move(out_).finish()); }

   private:
    replica_builder<T> out_;
  };
};

/// A tuple: the whole results first, then one column per element.
template <class R>
class tuple_collector {
 public:
  explicit tuple_collector(std::size_t n) : slots_(n) {}
  template <class V>
  void take(int r, V&& value) {
    slots_[static_cast<std::size_t>(r)].emplace(std::forward<V>(value));
  }
  auto finish() && { return run_result<R>::assemble(slots_); }

 private:
  std::vector<std::optional<R>> slots_;
};

/// Element I of a std::tuple or boost::hana::tuple. A named type where a lambda would do: nvcc 13
/// rejects a lambda inside a pack expansion ("parameter pack I was referenced but not expanded").
template <std::size_t I>
struct element_at {
  template <class... Ts>
  auto& operator()(std::tuple<Ts...>& t) const {
    return std::get<I>(t);
  }
  template <class... Ts>
  auto& operator()(boost::hana::tuple<Ts...>& t) const {
    return boost::hana::at_c<I>(t);
  }
};

template <template <class...> class Tuple, class... Ts>
struct tuple_run_result {
  using type = Tuple<typename lift_one<Ts>::type...>;
  template <std::size_t I, class Get>
  static auto column(std::vector<std::optional<Tuple<Ts...>>>& slots, Get get) {
    using E = std::remove_cvref_t<decltype(get(std::declval<Tuple<Ts...>&>()))>;
    std::vector<E> v;
    v.reserve(slots.size());
    for (auto& s : slots) v.push_back(std::move(get(*s)));
    return lift_one<E>::make(std::move(v));
  }
};

template <class... Ts>
struct run_result<std::tuple<Ts...>> : tuple_run_result<std::tuple, Ts...> {
  using collector = tuple_collector<std::tuple<Ts...>>;
  static auto assemble(std::vector<std::optional<std::tuple<Ts...>>>& slots) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<typename lift_one<Ts>::type...>(
          tuple_run_result<std::tuple, Ts...>::template column<I>(slots, element_at<I>{})...);
    }(std::index_sequence_for<Ts...>{});
  }
};
template <class A, class B>
struct run_result<std::pair<A, B>> : tuple_run_result<std::pair, A, B> {
  using collector = tuple_collector<std::pair<A, B>>;
  static auto assemble(std::vector<std::optional<std::pair<A, B>>>& slots) {
    using base = tuple_run_result<std::pair, A, B>;
    return std::pair<typename lift_one<A>::type, typename lift_one<B>::type>(
        base::template column<0>(slots, [](auto& t) -> auto& { return t.first; }),
        base::template column<1>(slots, [](auto& t) -> auto& { return t.second; }));
  }
};
template <class... Ts>
struct run_result<boost::hana::tuple<Ts...>> : tuple_run_result<boost::hana::tuple, Ts...> {
  using collector = tuple_collector<boost::hana::tuple<Ts...>>;
  static auto assemble(std::vector<std::optional<boost::hana::tuple<Ts...>>>& slots) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return boost::hana::tuple<typename lift_one<Ts>::type...>(
          tuple_run_result<boost::hana::tuple, Ts...>::template column<I>(slots, element_at<I>{})...);
    }(std::index_sequence_for<Ts...>{});
  }
};

}  // namespace mirror::detail
