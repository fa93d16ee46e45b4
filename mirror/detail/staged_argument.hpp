// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host arguments of run on devices whose memory the replicas' threads cannot read: a host value
// passed to run is copied to each replica's device once per call
// (docs/cuda.md#host-arguments-of-run).
//
// A shared argument (not a PerReplica, Mirrored or variable) whose structure is made of host
// arrays, scalars and tuples/structs of them is copied, array by array, into per-replica device
// buffers before fn starts, and fn receives the same structure with every host array replaced
// by the runtime's read-only view of that replica's copy (`Rt::view<const E>`; on
// devices::Cuda a `cuda::device_span<const E>`). Scalars stay host values (kernel arguments).
// Containers keep their shape: std::tuple, std::pair, std::array and boost::hana::tuple map
// member by member; a Hana struct S becomes a `staged_struct<S, ...>` whose members are read by
// name, `v[BOOST_HANA_STRING("images")]` (C++ cannot rebuild S with other member types).
//
// Host arrays are leaves of rank >= 1 that are not device-resident (std::vector, std::array,
// std::span, matrix and matrix_view, user leaves), std::span<const E> and matrix_view<const E>
// (not leaves: collectives cannot write them, but they are the natural way to pass read-only
// host data). A 2-D array arrives flat, rows * cols elements row-major: pass cols beside it.
// Scalars are arithmetic values, enums, pointers and views of device memory
// (`cuda::device_span`, passed as they are); a nest holding an owning device-resident leaf
// (`thrust::device_vector`) is passed as it is, whole. An argument that
// holds device memory, or anything that is not one of the shapes above, reaches fn as before
// (const&); a nest that mixes host arrays with such members is a compile error (staging::refused), because half of it would silently stay on the host.
//
// The views are valid while fn runs: the next run of the strategy copies its arguments into
// the same buffers (and frees a buffer that must grow), so fn must not return them or keep
// them beyond its call.

#include <array>
#include <boost/hana/accessors.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/unpack.hpp>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/leaf_traits.hpp>
#include <mirror/matrix.hpp>

namespace mirror::detail {

/// Read-only host views that are not leaves (collectives cannot write through them).
template <class T>
struct is_const_host_view : std::false_type {};
template <class E, std::size_t N>
struct is_const_host_view<std::span<const E, N>> : std::bool_constant<std::is_arithmetic_v<E>> {};
template <class E>
struct is_const_host_view<matrix_view<const E>> : std::bool_constant<std::is_arithmetic_v<E>> {};

/// A run of host-readable elements that the staging copies: see the file comment.
template <class T>
concept host_array = is_const_host_view<T>::value ||
                     (leaf<T> && leaf_traits<T>::rank >= 1 && !device_resident_leaf<T>);

/// `V<const E>` where `V<E>` is a device-resident leaf (`cuda::device_span<const E>`).
template <class T>
struct is_const_device_view : std::false_type {};
template <template <class> class V, class E>
struct is_const_device_view<V<const E>> : std::bool_constant<device_resident_leaf<V<E>>> {};

/// Device memory, viewed: already where the replicas read it, a cheap copy.
template <class T>
concept device_view = (device_resident_leaf<T> && leaf_traits<T>::is_view) || is_const_device_view<T>::value;

/// A value that reaches fn as it is inside a staged nest.
template <class T>
concept staging_scalar = std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_pointer_v<T> || device_view<T>;

/// An owning device-resident leaf (`thrust::device_vector`): a nest
/// holding one is passed as it is (not copied member by member), as before staging existed.
template <class T>
concept device_owner = device_resident_leaf<T> && !leaf_traits<T>::is_view;

/// The elements of host array x, read-only (a matrix row-major, rows * cols of them).
template <class E, std::size_t N>
std::span<const E> host_elements(const std::span<const E, N>& x) noexcept {
  return x;
}
template <class E>
std::span<const E> host_elements(const matrix_view<const E>& x) noexcept {
  return x.data;
}
template <host_array T>
  requires(!is_const_host_view<T>::value)
auto host_elements(const T& x) {
  return std::span<const typename leaf_traits<T>::element_type>(leaf_traits<T>::elements(x));
}

/// How a type takes part in staging.
enum class staging {
  as_is,         ///< not at all: passed to fn as it is
  scalars,       ///< only scalars, nothing to copy: passed as it is
  copied,        ///< at least one host array, everything else scalars or containers
  refused,       ///< host arrays beside members that cannot be staged
  device_owned,  ///< an owning device leaf: it, and any nest holding it, passed as it is
};

/// What a container whose members take part as `members` does.
consteval staging combine_staging(std::initializer_list<staging> members) {
  bool opaque = false, device = false, arrays = false;
  for (const staging m : members) {
    opaque = opaque || m == staging::as_is || m == staging::refused;
    device = device || m == staging::device_owned;
    arrays = arrays || m == staging::copied || m == staging::refused;
  }
  if (device) return staging::as_is;
  if (!arrays) return opaque ? staging::as_is : staging::scalars;
  return opaque ? staging::refused : staging::copied;
}

template <class T>
consteval staging staging_kind() {
  if constexpr (device_owner<T>) {
    return staging::device_owned;
  } else if constexpr (host_array<T>) {
    return staging::copied;
  } else if constexpr (staging_scalar<T>) {
    return staging::scalars;
  } else if constexpr (is_std_tuple_like<T>::value) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return combine_staging({staging_kind<std::remove_cvref_t<std::tuple_element_t<I, T>>>()...});
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_hana_tuple<T>::value) {
    return []<class... Ts>(boost::hana::tuple<Ts...>*) {
      return combine_staging({staging_kind<std::remove_cvref_t<Ts>>()...});
    }(static_cast<T*>(nullptr));
  } else if constexpr (is_hana_struct<T>) {
    return []<class... Ms>(type_list<Ms...>) {
      return combine_staging({staging_kind<Ms>()...});
    }(decltype(struct_member_types<T>()){});
  } else {
    return staging::as_is;
  }
}

/// True when a shared argument of type T is copied to each replica's device by run.
template <class T>
inline constexpr bool staged_on_device = staging_kind<std::remove_cvref_t<T>>() == staging::copied;

/// True when T holds host arrays beside members that cannot be staged (run refuses it on a
/// device without host-readable memory: see the file comment).
template <class T>
inline constexpr bool staging_refused = staging_kind<std::remove_cvref_t<T>>() == staging::refused;

/// Index of the member of Hana struct S called Name (a boost::hana::string type).
template <class S, class Name>
consteval std::size_t member_index() {
  return boost::hana::unpack(boost::hana::accessors<S>(), [](auto... member) {
    const bool match[] = {std::is_same_v<std::remove_cvref_t<decltype(boost::hana::first(member))>, Name>...};
    std::size_t i = 0;
    while (i < sizeof...(member) && !match[i]) ++i;
    return i;
  });
}

/// A Hana struct S as a replica's fn receives it on a device without host-readable memory: its
/// members in declaration order, host arrays replaced by device views.
template <class S, class... Ms>
struct staged_struct {
  std::tuple<Ms...> members;

  /// The member called `name`: `v[BOOST_HANA_STRING("images")]`.
  template <class Name>
  constexpr const auto& operator[](Name) const noexcept {
    constexpr std::size_t i = member_index<S, Name>();
    static_assert(i < sizeof...(Ms), "mirror: the staged struct has no member of this name");
    return std::get<i>(members);
  }
};

/// Replica `self`'s device copy of host value x (see the file comment). `slot` numbers the host
/// arrays of one run in a fixed order, so every run reuses the same per-replica buffers.
template <class Rt, class T>
auto stage_to_device(Rt& rt, int self, const T& x, std::size_t& slot) {
  if constexpr (host_array<T>) {
    const auto host = host_elements(x);
    using E = std::remove_const_t<typename decltype(host)::element_type>;
    static_assert(requires { typename Rt::template view<const E>; },
                  "mirror: this device's runtime cannot stage host arguments of run (it needs "
                  "`template <class E> using view` and `stage_argument`; mirror/concepts/device.hpp)");
    return rt.template stage_argument<E>(self, slot++, host);
  } else if constexpr (staging_scalar<T>) {
    return x;
  } else if constexpr (is_std_tuple_like<T>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      if constexpr (requires { typename T::value_type; typename T::iterator; }) {
        // std::array of nests
        using U = decltype(stage_to_device(rt, self, std::declval<const typename T::value_type&>(), slot));
        return std::array<U, sizeof...(I)>{{stage_to_device(rt, self, std::get<I>(x), slot)...}};
      } else if constexpr (requires { typename T::first_type; typename T::second_type; }) {
        return std::pair<decltype(stage_to_device(rt, self, x.first, slot)),
                         decltype(stage_to_device(rt, self, x.second, slot))>{stage_to_device(rt, self, x.first, slot),
                                                                              stage_to_device(rt, self, x.second, slot)};
      } else {
        // braced initialisation: the members are staged in order
        return std::tuple<decltype(stage_to_device(rt, self, std::get<I>(x), slot))...>{
            stage_to_device(rt, self, std::get<I>(x), slot)...};
      }
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_hana_tuple<T>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return boost::hana::tuple<decltype(stage_to_device(rt, self, boost::hana::at_c<I>(x), slot))...>{
          stage_to_device(rt, self, boost::hana::at_c<I>(x), slot)...};
    }(std::make_index_sequence<decltype(boost::hana::length(x))::value>{});
  } else {
    static_assert(is_hana_struct<T>);
    return boost::hana::unpack(boost::hana::accessors<T>(), [&](auto... member) {
      using staged = staged_struct<T, decltype(stage_to_device(rt, self, boost::hana::second(member)(x), slot))...>;
      return staged{{stage_to_device(rt, self, boost::hana::second(member)(x), slot)...}};  // braced: in order
    });
  }
}

}  // namespace mirror::detail
