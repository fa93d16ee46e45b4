// SPDX-License-Identifier: Apache-2.0
#pragma once
// Cross-replica reduction of host values (Strategy::reduce): PerReplica<T> components → T.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>
#include <mirror/axis.hpp>
#include <mirror/detail/element_kernels.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/error.hpp>

namespace mirror::detail {

/// Where two nests of one type first differ in a leaf's size; false when they do not. (Not a
/// std::optional: its members are instantiated in every translation unit that checks shapes.)
struct shape_mismatch {
  std::size_t leaf = 0, first = 0, second = 0;
  const char* leaf_type = nullptr;  // mangled (typeid(L).name()): demangled only for the message
  explicit operator bool() const noexcept { return leaf_type != nullptr; }
};
template <class T>
shape_mismatch first_shape_mismatch(const T& a, const T& b) {
  shape_mismatch found;
  std::size_t k = 0;
  for_each_leaf(
      [&](const auto& x, const auto& y) {
        using L = std::remove_cvref_t<decltype(x)>;
        const std::size_t nx = leaf_traits<L>::elements(x).size(), ny = leaf_traits<L>::elements(y).size();
        if (nx != ny && !found) found = shape_mismatch{k, nx, ny, typeid(L).name()};
        ++k;
      },
      a, b);
  return found;
}

/// reduce_components' shape error: component r's leaf m.leaf differs from component 0's.
[[noreturn, gnu::cold]] MIRROR_DETAIL_INLINE void throw_component_shape_error(const char* api, const shape_mismatch& m,
                                                                  std::size_t r);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void throw_component_shape_error(const char* api, const shape_mismatch& m, std::size_t r) {
  throw shape_error(format("mirror::Strategy::%s: shape mismatch at leaf %zu (%s): %zu elements on replica %zu "
                           "but %zu on replica 0; every replica's value must have the same shape",
                           api, m.leaf, demangle(m.leaf_type).c_str(), m.second, r, m.first));
}
#endif

/// Strategy::reduce's error for a value whose component count is not the replica count.
[[noreturn, gnu::cold]] MIRROR_DETAIL_INLINE void throw_component_count_error(const char* api, std::size_t components,
                                                                              int replicas, bool multi_worker);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void throw_component_count_error(const char* api, std::size_t components, int replicas,
                                                      bool multi_worker) {
  throw shape_error(format("mirror::Strategy::%s: value has %zu components but the strategy has %d replicas%s; reduce "
                           "a value with one component per replica (what run returns on this strategy)",
                           api, components, replicas, multi_worker ? " in this worker" : ""));
}
#endif

/// How reduce_components spreads its work: `run(self, bytes, body, arg)` calls body(arg, part,
/// parts) for every part it chooses (Strategy: over its threads for large leaves; serial_parallel:
/// once, on the calling thread). Function pointers, not a template parameter, so that the
/// per-leaf code below is compiled once, not per nest and caller.
struct parallel_ref {
  void* self;
  void (*run)(void* self, std::size_t bytes, void (*body)(void*, int, int), void* arg);
};
// A function, not a captureless lambda: nvcc 13 writes the lambda's unnamed parameters into its
// host code as undeclared names (`__T0`), so a .cu including mirror failed to compile.
inline void run_serially(void*, std::size_t, void (*body)(void*, int, int), void* arg) { body(arg, 0, 1); }
inline parallel_ref serial_parallel() noexcept { return {nullptr, &run_serially}; }

/// dst[i] = in[0][i] op ... op in[n-1][i] for i < size, split by `parallel`. `op` is sum, min,
/// max or prod: callers reduce a mean as a sum and divide once they have every worker's part
/// (detail::cross_op). `dst` and `in` hold elements of the type `e` describes: one function for
/// every element type (only the arithmetic is compiled per type, as in ops::ChunkOwnerAllReduce).
MIRROR_DETAIL_INLINE void reduce_leaf(ReduceOp op, void* dst, std::size_t size, const void* const* in,
                                      std::size_t n, parallel_ref parallel, const element_kernels& e);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void reduce_leaf(ReduceOp op, void* dst, std::size_t size, const void* const* in,
                                      std::size_t n, parallel_ref parallel, const element_kernels& e) {
  struct job {
    ReduceOp op;
    unsigned char* dst;
    std::size_t size;
    const void* const* in;
    std::size_t n;
    const element_kernels* e;
  } j{op, static_cast<unsigned char*>(dst), size, in, n, &e};
  parallel.run(
      parallel.self, size * n * e.size(),
      [](void* p, int part, int parts) {
        const job& w = *static_cast<const job*>(p);
        const std::size_t bytes = w.e->size();
        // (Not a structured binding: clang before 16 cannot capture one in the lambda below.)
        const auto range = backend::chunk_of(0, w.size, part, parts, bytes);
        const std::size_t a = range.first, b = range.second;
        if (a >= b) return;
        const auto component = [&](std::size_t r) { return static_cast<const unsigned char*>(w.in[r]) + a * bytes; };
        unsigned char* const out = w.dst + a * bytes;
        std::memmove(out, component(0), (b - a) * bytes);
        for (std::size_t r = 1; r < w.n; ++r) w.e->combine(w.op, out, component(r), b - a);
      },
      &j);
}
#endif

/// Every component's leaves, by position: where each starts and how many elements it has
/// ([k * n + r]: leaf position k of replica r). Not a std::vector, and not a template: one
/// definition for every nest type.
class leaf_table {
 public:
  explicit leaf_table(std::size_t entries) : data_(new const void*[entries]), sizes_(new std::size_t[entries]) {}
  leaf_table(const leaf_table&) = delete;
  leaf_table& operator=(const leaf_table&) = delete;
  ~leaf_table() {
    delete[] sizes_;
    delete[] data_;
  }
  const void** data() noexcept { return data_; }
  std::size_t* sizes() noexcept { return sizes_; }

 private:
  const void** data_;
  std::size_t* sizes_;
};

/// The first leaf position whose size differs between component 0 and another, as
/// throw_component_shape_error wants it (`types`: the leaves' types, for the message).
MIRROR_DETAIL_INLINE void check_leaf_sizes(const std::size_t* sizes, std::size_t leaves, std::size_t n,
                                           const std::type_info* const* types, const char* api);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void check_leaf_sizes(const std::size_t* sizes, std::size_t leaves, std::size_t n,
                                           const std::type_info* const* types, const char* api) {
  for (std::size_t r = 1; r < n; ++r) {
    for (std::size_t k = 0; k < leaves; ++k) {
      const std::size_t first = sizes[k * n], mine = sizes[k * n + r];
      if (mine != first) throw_component_shape_error(api, shape_mismatch{k, first, mine, types[k]->name()}, r);
    }
  }
}
#endif

/// out = the element-wise reduction of the components (out starts as a copy of component 0);
/// `op` as for reduce_leaf (no mean).
/// Each part of `parallel` reduces its slice of every leaf in replica order, so the result does
/// not depend on the split. The shapes are checked on the sizes gathered with the leaves (one
/// walk of each component, not a second walk of component pairs).
template <class T>
void reduce_components(ReduceOp op, std::span<const T> components, T& out, parallel_ref parallel, const char* api) {
  const std::size_t n = components.size();
  leaf_table inputs(leaf_count<T>() * n);
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t k = 0;
    for_each_leaf(
        [&](const auto& l) {
          const auto e = detail::elements_of(l);
          inputs.data()[k * n + r] = e.data();
          inputs.sizes()[k * n + r] = e.size();
          ++k;
        },
        components[r]);
  }
  check_leaf_sizes(inputs.sizes(), leaf_count<T>(), n, leaf_type_infos<T>, api);
  std::size_t k = 0;
  for_each_leaf(
      [&](auto& o) {
        using L = std::remove_cvref_t<decltype(o)>;
        using E = leaf_element_t<L>;
        require_host_element<E>();
        const std::span<E> dst = leaf_traits<L>::elements(o);
        reduce_leaf(op, dst.data(), dst.size(), inputs.data() + k * n, n, parallel, element_kernels_of<E>::value);
        ++k;
      },
      out);
}

/// The axis0 result type: each leaf of rank >= 1 becomes its element type.
template <class T>
struct axis0_result {
  static auto pick() {
    if constexpr (leaf<T>) {
      static_assert(leaf_traits<T>::rank >= 1,
                    "mirror::Strategy::reduce(op, value, axis0): a scalar leaf has no axis 0; "
                    "reduce it without the axis argument");
      return std::type_identity<leaf_element_t<T>>{};
    } else if constexpr (is_std_tuple_like<T>::value && !is_hana_struct<T>) {
      return []<template <class...> class Tpl, class... Ts>(std::type_identity<Tpl<Ts...>>) {
        return std::type_identity<Tpl<typename axis0_result<Ts>::type...>>{};
      }(std::type_identity<T>{});
    } else {
      static_assert(sizeof(T) == 0,
                    "mirror::Strategy::reduce(op, value, axis0): axis0 is defined for leaves and for "
                    "std::tuple, std::pair and std::array nests of them; reduce the members of a Hana "
                    "struct or hana::tuple one by one");
      return std::type_identity<T>{};
    }
  }
  using type = typename decltype(pick())::type;
};
template <class E, std::size_t N>
struct axis0_result<std::array<E, N>> {
  static auto pick() {
    if constexpr (leaf<std::array<E, N>>) {
      return std::type_identity<E>{};
    } else {
      return std::type_identity<std::array<typename axis0_result<E>::type, N>>{};
    }
  }
  using type = typename decltype(pick())::type;
};
template <class T>
using axis0_result_t = typename axis0_result<T>::type;

/// Reduces every element of every component of one leaf position to one scalar, in replica
/// order then element order.
template <class E, class L>
E reduce_leaf_axis0(ReduceOp op, const std::vector<const L*>& leaves) {
  E acc = identity<E>(op);
  std::size_t count = 0;
  for (const L* l : leaves) {
    const auto xs = leaf_traits<L>::elements(*l);
    for (const E& x : xs) acc = combine(op, acc, x);
    count += xs.size();
  }
  if (op == ReduceOp::mean) {
    if (count == 0) {
      if constexpr (std::is_integral_v<E>) {
        throw shape_error("mirror::Strategy::reduce(mean, value, axis0): no elements on any replica; the mean "
                          "of zero " + type_name<E>() + " elements is undefined (use sum, or a floating-point leaf, which gives NaN)");
      } else {
        return acc / E(0);
      }
    }
    acc = divide(acc, count);
  }
  return acc;
}

/// Builds the axis0 result of nest T from the components, walking the result and components in
/// lockstep (the result's structure is T's with leaves replaced by scalars).
template <class T, class R>
void reduce_axis0_into(ReduceOp op, R& out, std::vector<const T*> components) {
  if constexpr (leaf<T>) {
    out = reduce_leaf_axis0<R>(op, components);
  } else if constexpr (is_std_tuple_like<T>::value) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            using Ti = std::remove_cvref_t<std::tuple_element_t<I, T>>;
            std::vector<const Ti*> sub;
            sub.reserve(components.size());
            for (const T* c : components) sub.push_back(&std::get<I>(*c));
            reduce_axis0_into<Ti>(op, std::get<I>(out), std::move(sub));
          }(),
          ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  }
}

}  // namespace mirror::detail
