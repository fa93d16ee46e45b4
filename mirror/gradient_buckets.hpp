// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::GradientBuckets<T>`: a bucketed all-reduce of a nest of gradient buffers that starts
/// each bucket while the backward pass goes on (`ctx.gradient_buckets`).

#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/backend/cut_of.hpp>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/access.hpp>
#include <mirror/detail/async_queue.hpp>
#include <mirror/detail/agreement_check.hpp>  // site_text
#include <mirror/detail/format.hpp>
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/error.hpp>
#include <mirror/pending.hpp>
#include <mirror/reduce_op.hpp>
#include <mirror/source_location.hpp>
#include <mirror/synced.hpp>

namespace mirror {

/// The tag of the reduce-scatter form of `ctx.gradient_buckets` (`mirror::sharded`), whose
/// buckets a variable's `update_sharded` takes.
struct sharded_t {
  explicit sharded_t() = default;
};
/// `ctx.gradient_buckets(op, grads, bytes, mirror::sharded)`: each bucket reduce-scatters.
inline constexpr sharded_t sharded{};

namespace detail {
/// The first leaf type among Ls that lives in GPU memory and holds E; void if none.
template <class E, class... Ls>
struct device_leaf_of {
  using type = void;  ///< none
};
template <class E, class L, class... Ls>
struct device_leaf_of<E, L, Ls...> {
  /// L, or the first such leaf after it
  using type = std::conditional_t<device_resident_leaf<L> && std::is_same_v<leaf_element_t<L>, E>, L,
                                  typename device_leaf_of<E, Ls...>::type>;
};
/// What a bucket of element type E of nest T is reduced as: a `std::span<E>` of host memory, or,
/// where T's leaves of E are in GPU memory, that leaf type made over the bucket's elements as
/// `L{data, count}` (`mirror::cuda::device_span`).
template <class T, class E, class Ls = leaf_types_t<T>>
struct bucket_leaf;
template <class T, class E, class... Ls>
struct bucket_leaf<T, E, type_list<Ls...>> {
  using device = typename device_leaf_of<E, Ls...>::type;              ///< void for host memory
  using type = std::conditional_t<std::is_void_v<device>, std::span<E>, device>;  ///< the bucket's leaf
};

template <class T, bool Sharded, class Types = element_types_t<T>>
struct bucket_storage;
template <class T, bool Sharded, class... Es>
struct bucket_storage<T, Sharded, type_list<Es...>> {
  /// What a bucket's collective of element type E gives: the all-reduced span, or this
  /// replica's cut of it.
  template <class E>
  using result = std::conditional_t<Sharded, typename bucket_leaf<T, E>::type, Synced<typename bucket_leaf<T, E>::type>>;
  /// Per element type: the handle of each bucket of that type (indexed by bucket).
  using pending = std::tuple<std::vector<std::optional<Pending<result<Es>>>>...>;
  /// Per element type: how a bucket's collective is started on the replica's context.
  using starters = std::tuple<Pending<result<Es>> (*)(void*, ReduceOp, Es*, std::size_t,
                                                      const mirror::source_location&)...>;
  /// Per element type: the packed buffers of the buckets of several leaves.
  using staging = std::tuple<std::vector<Es>...>;
};
}  // namespace detail

/// DDP's Reducer, typed (docs/guide.md\#overlapping-communication): the leaves of `grads` are cut into
/// buckets in *reverse* leaf order (backward produces the last layer's gradients first):
/// bucket 0 holds the last leaves, each bucket a run of consecutive leaves of one element type
/// whose bytes reach the bucket size (`0`: one leaf each), the last bucket the rest. The trainer
/// calls `ready(i)` as the backward pass finishes leaf i (in nest order, any order of calls);
/// bucket b starts its all-reduce (`all_reduce_async`: one collective per bucket; leaves that lie
/// one after another in memory, as layers cut from one flat buffer do, are reduced in place as
/// one span, others are packed into one buffer) inside the `ready` call that makes all its leaves ready,
/// once bucket b-1 has started, so every replica starts the same collectives in the same order.
/// `finish()` starts what is left, waits for every bucket and leaves the reduced values in
/// `grads`. Results are bitwise those of `ctx.all_reduce(op, span)` of each bucket's leaves.
///
/// **Requires**: the same leaf sizes on every replica (else the first bucket that differs is a
/// `mirror::shape_error` on every replica, naming the bucket's leaves); `grads`' buffers are not
/// touched between `ready(i)` and `finish()` (a leaf belongs to its bucket's collective). Before
/// its bucket starts a leaf may get a new buffer of the same size (the bucket reads it where it
/// is then); a resized leaf, or a span moved out of an in-place run of adjacent spans, is a
/// `mirror::error` naming the leaf. **GPU leaves** (`mirror::cuda::device_span`, on `devices::Cuda`): never packed (that
/// would need device copies the buckets exist to avoid), so a bucket holds a run of leaves that
/// lie one after another in GPU memory, and is cut early where the next leaf does not (cut one
/// flat gradient buffer into layers and every bucket is one in-place span); a nest mixing host and
/// GPU leaves is a compile error.
/// **Errors**: `ready` of a leaf out of range or made ready twice, or `finish` twice:
/// `mirror::error`; the collectives' errors from `ready` or `finish`, on every replica (after one,
/// `grads` holds some buckets' results and others' inputs). A `ready` call also copies back the
/// results of packed buckets whose collectives have completed, so `finish` copies little. An object
/// destroyed without `finish()` waits for the buckets it started, and `Strategy::run` then throws
/// a `mirror::error` naming the leaves never made ready (or, where every leaf was, the missing
/// `finish()`), since `grads` holds this replica's own values there; no error is added while an
/// exception already unwinds `fn`.
/// **Allocation**: the packed buffers are kept by the replica's thread and reused by the next
/// object of the same nest type with the same plan, so a training loop allocates them once; the
/// plan too is made once per loop: the next object of the type on the thread reuses it while
/// the leaves' addresses and sizes, the bucket size and the replica count stay the same.
///
/// **The sharded form** (`Sharded`, from `ctx.gradient_buckets(op, grads, bytes,
/// mirror::sharded)`): each bucket is reduce-scattered instead (`reduce_scatter_async`), so that
/// after `finish()` this replica's cut of every leaf (the batch-split rule over the replicas, as
/// `ctx.reduce_scatter`) holds the reduced gradient's cut, and the rest of each leaf is
/// unspecified; a variable's `update_sharded(step, buckets, states...)` takes the object and
/// finishes it. A reduce-scatter cuts each leaf, not a run of them, so a bucket of several leaves
/// must be packed: replica by replica (every leaf's cut 0, zero-padded to its largest cut, then
/// every leaf's cut 1, ...), so that one reduce-scatter hands each replica its cut of every leaf,
/// and a replica copies back only its own cuts. Only leaves under 64 KiB are packed, up to the
/// bucket size; a larger leaf is a bucket of its own, reduce-scattered in place (copying it would
/// cost more than the collective it saves). Results are bitwise those of
/// `ctx.reduce_scatter(op, span)` of the packed span (for one leaf: of the leaf). GPU leaves are
/// never packed: there, each bucket is one leaf.
template <class T, bool Sharded = false>
class GradientBuckets {
  using storage = detail::bucket_storage<T, Sharded>;

 public:
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets() {
    if (finished_) return;
    release_staging();
    // The started buckets complete first, so that an error of their own collectives is the
    // one fn's caller hears (the queue keeps the first).
    [&]<class... Es>(detail::type_list<Es...>) {
      ((std::get<index_of<Es>()>(pending_).clear()), ...);
    }(detail::element_types_t<T>{});
    // Dropped without finish() while fn goes on: some leaves keep this replica's own values
    // (a leaf never made ready) or the packed input (a bucket never unpacked). fn's caller
    // must hear of it, and a destructor cannot throw: Strategy::run throws it when fn returns.
    if (std::uncaught_exceptions() == exceptions_) queue_->fail_at_end(dropped_error());
  }

  /// Leaf `i` (in the nest's leaf order) is final; starts every bucket that is now due.
  void ready(std::size_t i) {
    if (i >= leaves_.size()) {
      throw error(detail::format("mirror::GradientBuckets::ready(%zu) at %s: the nest has %zu leaves (0..%zu); "
                                 "pass a leaf's index in the nest's leaf order",
                                 i, detail::site_text(where_).c_str(), leaves_.size(), leaves_.size() - 1));
    }
    if (finished_ || leaves_[i].ready) {
      throw error(detail::format("mirror::GradientBuckets::ready(%zu) at %s: %s; call ready once per leaf, "
                                 "before finish()",
                                 i, detail::site_text(where_).c_str(),
                                 finished_ ? "finish() was already called" : "this leaf was already made ready"));
    }
    leaves_[i].ready = true;
    --buckets_[leaves_[i].bucket].remaining;
    // (next_ counts a bucket once its start succeeded: one whose start threw is never waited for.)
    for (; next_ < buckets_.size() && buckets_[next_].remaining == 0; ++next_) start(next_);
    unpack_completed();
  }

  /// Starts every bucket not started yet, waits for all of them, and leaves the results in
  /// `grads`. Throws the first bucket's error (every bucket still completes first). When every
  /// leaf of `grads` is a view (`std::span`), also returns those views as `Synced<T>`, which a
  /// variable's `update` takes (a nest with owning leaves returns nothing: copying them would
  /// cost what the buckets saved). The sharded form returns, for view leaves, a plain `T` whose
  /// leaves view this replica's cuts, as `ctx.reduce_scatter` returns.
  auto finish() {
    wait_all();
    if constexpr (all_views()) {
      if constexpr (Sharded) {
        T cuts(*grads_);
        detail::for_each_leaf(
            [&](auto& l) {
              using L = std::remove_cvref_t<decltype(l)>;
              const auto e = leaf_traits<L>::elements(l);
              const auto cut = backend::cut_of(e.size(), replicas_, replica_);
              l = L(e.data() + cut.first, cut.second);
            },
            cuts);
        return cuts;
      } else {
        return detail::access::synced(T(*grads_));
      }
    }
  }

  /// The number of buckets.
  std::size_t num_buckets() const noexcept { return buckets_.size(); }
  /// The bucket of leaf `i` (0 holds the last leaves).
  std::size_t bucket_of(std::size_t i) const { return leaves_.at(i).bucket; }
  /// Whether `finish()` has been called.
  bool finished() const noexcept { return finished_; }
  /// The nest the buckets reduce.
  const T& grads() const noexcept { return *grads_; }
  /// Where `ctx.gradient_buckets` was called (errors name it).
  const mirror::source_location& where() const noexcept { return where_; }

 private:
  static constexpr bool on_device() { return detail::has_device_leaf<T>(); }
  static constexpr bool all_on_device() {
    return []<class... Ls>(detail::type_list<Ls...>) {
      return (true && ... && device_resident_leaf<Ls>);
    }(detail::leaf_types_t<T>{});
  }
  static constexpr bool all_views() {
    return []<class... Ls>(detail::type_list<Ls...>) {
      return (true && ... && leaf_traits<Ls>::is_view);
    }(detail::leaf_types_t<T>{});
  }

  void wait_all() {
    if (finished_) {
      throw error(detail::format("mirror::GradientBuckets::finish() at %s: called twice",
                                 detail::site_text(where_).c_str()));
    }
    finished_ = true;
    std::exception_ptr first;
    try {
      for (; next_ < buckets_.size(); ++next_) start(next_);
    } catch (...) {
      first = std::current_exception();
    }
    // The buckets that started complete (and are unpacked) whatever failed after them.
    for (; waited_ < next_; ++waited_) {
      try {
        wait_for(waited_);
      } catch (...) {
        if (first == nullptr) first = std::current_exception();
      }
    }
    release_staging();
    if (first != nullptr) std::rethrow_exception(first);
  }

  /// Bucket b's collective is complete: its packed leaves get their results.
  void wait_for(std::size_t b) {
    bool posted = false;
    naming_leaves(b, [&] {
      with_type(buckets_[b].type, [&]<class E>() {
        auto& p = std::get<index_of<E>()>(pending_)[b];
        if (!p) return;  // its start threw (that error left through ready())
        posted = true;
        (void)p->wait();
      });
    });
    if (posted && buckets_[b].packed) unpack(buckets_[b]);
  }

  /// Runs `f` (a step of bucket b's collective); a shape_error from it is thrown again with the
  /// bucket's leaves named, the original nested: the collective saw one span, the user wrote
  /// leaves. (The error may be another's, refused here: the words say where it was met, not
  /// whose it is. Nested, so that a multi-worker strategy still knows the original for the error
  /// every worker raised together.)
  template <class F>
  void naming_leaves(std::size_t b, F&& f) {
    try {
      f();
    } catch (const shape_error& e) {
      const bucket& B = buckets_[b];
      std::string leaves;
      for (std::size_t k = B.first; k <= B.last && k < B.first + 8; ++k) {
        leaves += detail::format("%sleaf %zu (%s) %zu elements", leaves.empty() ? "" : ", ", k,
                                 leaves_[k].type_name().c_str(), leaves_[k].count)
                      .c_str();
      }
      if (B.last >= B.first + 8) leaves += ", ...";
      std::throw_with_nested(shape_error(detail::format(
          "mirror::GradientBuckets at %s, bucket %zu, which reduces leaves %zu..%zu of grads as one span of %zu "
          "elements (%s on replica %d; where the replicas' sizes differ, one of these leaves does): %s",
          detail::site_text(where_).c_str(), b, B.first, B.last, span_of(B), leaves.c_str(), replica_, e.what())));
    }
  }

  /// During backward: the buckets whose collectives have completed, in order, take their
  /// results now, so that finish() has only the last ones to copy back.
  void unpack_completed() {
    while (waited_ < next_ && ready_for(waited_)) wait_for(waited_++);
  }
  bool ready_for(std::size_t b) const noexcept {
    bool r = false;
    with_type(buckets_[b].type, [&]<class E>() {
      const auto& p = std::get<index_of<E>()>(pending_)[b];
      r = !p || p->ready();
    });
    return r;
  }

  template <class> friend class ReplicaContext;

  std::exception_ptr dropped_error() const noexcept {
    try {
      std::string never;
      std::size_t count = 0;
      for (std::size_t i = 0; i < leaves_.size(); ++i) {
        if (leaves_[i].ready) continue;
        if (++count <= 8) never += detail::format("%s%zu", never.empty() ? "" : ", ", i).c_str();
      }
      if (count > 8) never += ", ...";
      const std::string which =
          count == 0 ? std::string("every leaf was made ready, but without finish() the results of packed buckets "
                                   "were never copied into grads")
                     : detail::format("leaves {%s} (%zu of %zu) were never made ready, so their buckets never started",
                                      never.c_str(), count, leaves_.size())
                           .c_str();
      return std::make_exception_ptr(error(detail::format(
          "mirror::GradientBuckets at %s (replica %d) was destroyed without finish(): %s; grads holds this replica's "
          "own values there, not the reduction, and the other replicas may wait for those buckets; call ready(i) for "
          "every leaf, then finish(), before the object goes out of scope",
          detail::site_text(where_).c_str(), replica_, which.c_str())));
    } catch (...) {
      return std::current_exception();  // out of memory: that is what fn's caller hears
    }
  }

  // The sharded form packs only leaves smaller than this, which would each cost a collective's
  // fixed time more than their copies; a larger leaf is a bucket of its own, reduce-scattered in
  // place (docs/performance.md#overlap has the measurement).
  static constexpr std::size_t sharded_pack_limit = 64 * 1024;

  struct leaf {
    void* data;
    std::size_t count;
    unsigned type;       // index in element_types_t<T>
    std::size_t bucket;
    bool ready = false;
    std::string (*type_name)() = nullptr;  // the leaf's type, for errors
    // The leaf object in grads, and how to read where its elements lie now (reread_leaves):
    // one call per leaf, not a walk of the nest per bucket.
    void* object = nullptr;
    void (*read)(void* object, void*& data, std::size_t& count) = nullptr;
  };
  struct bucket {
    std::size_t first, last;  // leaves [first, last], in nest order
    unsigned type;
    std::size_t remaining;    // leaves not ready yet
    std::size_t elements;     // the leaves' elements
    std::size_t offset;       // in the type's staging (packed buckets)
    bool packed;              // several leaves: packed into staging
    std::size_t block;        // sharded and packed: one replica's block (every leaf's largest cut)
  };
  // The elements bucket B's collective covers: its leaves' (an all-reduce, or one leaf), or a
  // block per replica (a packed sharded bucket).
  std::size_t span_of(const bucket& B) const noexcept {
    return Sharded && B.packed ? B.block * static_cast<std::size_t>(replicas_) : B.elements;
  }

  template <class E>
  static constexpr unsigned index_of() {
    return []<class... Es>(detail::type_list<Es...>) {
      unsigned i = 0, found = 0;
      ((std::is_same_v<E, Es> ? (found = i, ++i) : ++i), ...);
      return found;
    }(detail::element_types_t<T>{});
  }
  template <class F>
  static void with_type(unsigned type, F&& f) {
    detail::for_each_type(detail::element_types_t<T>{}, [&]<class E>() {
      if (index_of<E>() == type) f.template operator()<E>();
    });
  }

  template <class Context>
  GradientBuckets(Context& ctx, ReduceOp op, T& grads, std::size_t bucket_bytes, const mirror::source_location& where)
      : context_(&ctx),
        queue_(&ctx.async_),
        op_(op),
        where_(where),
        grads_(&grads),
        replicas_(ctx.num_replicas_in_sync()),
        replica_(ctx.replica_id_in_sync_group()) {
    static_assert(!on_device() || all_on_device(),
                  "mirror::ReplicaContext::gradient_buckets(op, grads, bytes): grads mixes leaves in GPU memory with "
                  "host leaves; pass a nest of one kind (GPU buckets are never packed, host ones may be)");
    detail::for_each_leaf(
        [&](auto& l) {
          using L = std::remove_cvref_t<decltype(l)>;
          using E = leaf_element_t<L>;
          const auto e = leaf_traits<L>::elements(l);
          leaves_.push_back({static_cast<void*>(e.data()), e.size(), index_of<E>(), 0, false,
                             +[] { return detail::type_name<L>(); },
                             static_cast<void*>(std::addressof(l)), +[](void* o, void*& data, std::size_t& count) {
                               const auto now = leaf_traits<L>::elements(*static_cast<L*>(o));
                               data = static_cast<void*>(now.data());
                               count = now.size();
                             }});
        },
        grads);
    [&]<class... Es>(detail::type_list<Es...>) {
      starters_ = {+[](void* c, ReduceOp o, Es* data, std::size_t n, const mirror::source_location& w) {
        using L = typename detail::bucket_leaf<T, Es>::type;
        if constexpr (Sharded) {
          return static_cast<Context*>(c)->reduce_scatter_async(o, L{data, n}, w);
        } else {
          return static_cast<Context*>(c)->all_reduce_async(o, L{data, n}, w);
        }
      }...};
    }(detail::element_types_t<T>{});
    plan_once(bucket_bytes);
    [&]<class... Es>(detail::type_list<Es...>) {
      ((std::get<index_of<Es>()>(pending_).resize(buckets_.size())), ...);
    }(detail::element_types_t<T>{});
    take_staging();
  }

  /// The plan of the previous object of this type on this thread where nothing it depends on
  /// changed (the leaves' addresses and sizes, the bucket size, the replica count: a training
  /// loop's steps), else a new one, kept for the next object.
  void plan_once(std::size_t bucket_bytes) {
    thread_staging& k = kept();
    const bool same = k.planned && k.plan_cap == bucket_bytes && k.plan_replicas == replicas_ &&
                      k.plan_leaves.size() == leaves_.size() && [&] {
                        for (std::size_t i = 0; i < leaves_.size(); ++i) {
                          if (k.plan_leaves[i].data != leaves_[i].data || k.plan_leaves[i].count != leaves_[i].count) {
                            return false;
                          }
                        }
                        return true;
                      }();
    if (same) {
      // The plan's leaves, read through this object's nest (another object, perhaps, than the
      // one the plan was made for).
      for (std::size_t i = 0; i < leaves_.size(); ++i) {
        k.plan_leaves[i].object = leaves_[i].object;
        k.plan_leaves[i].read = leaves_[i].read;
      }
      leaves_ = k.plan_leaves;
      buckets_ = k.plan_buckets;
      staged_ = k.plan_staged;
      return;
    }
    plan(bucket_bytes);
    k.planned = true;
    k.plan_cap = bucket_bytes;
    k.plan_replicas = replicas_;
    k.plan_leaves = leaves_;
    k.plan_buckets = buckets_;
    k.plan_staged = staged_;
  }

  /// The buckets, from the last leaf backwards.
  void plan(std::size_t bucket_bytes) {
    std::vector<std::size_t> staged(std::tuple_size_v<typename storage::staging>, 0);
    std::size_t k = leaves_.size();
    while (k > 0) {
      bucket b{};
      b.last = k - 1;
      b.type = leaves_[k - 1].type;
      std::size_t bytes = 0;
      const bool alone = !packable(k - 1);
      do {
        --k;
        bytes += leaves_[k].count * element_bytes(b.type);
        b.elements += leaves_[k].count;
        leaves_[k].bucket = buckets_.size();
        ++b.remaining;
      } while (!alone && k > 0 && bytes < bucket_bytes && leaves_[k - 1].type == b.type && joins(k - 1, k) &&
               packable(k - 1));
      b.first = k;
      // Leaves that lie one after another in memory (a flat gradient buffer cut into layers, as
      // DDP's bucket views are) are all-reduced in place as one span: nothing to pack. A
      // reduce-scatter cuts each leaf, not their concatenation: several leaves are packed.
      b.packed = Sharded ? b.first != b.last : false;
      for (std::size_t j = b.first; j < b.last && !b.packed; ++j) b.packed = !adjacent(j, j + 1);
      if (b.packed) {
        b.block = 0;
        for (std::size_t j = b.first; j <= b.last; ++j) b.block += backend::cut_of(leaves_[j].count, replicas_, 0).second;
        b.offset = staged[b.type];
        staged[b.type] += span_of(b);
      }
      buckets_.push_back(b);
    }
    staged_ = std::move(staged);
  }

  // Whether leaf j may share a bucket with other leaves: in the sharded form, only a leaf below
  // sharded_pack_limit (every leaf of the all-reduce form).
  bool packable(std::size_t j) const noexcept {
    return !Sharded || leaves_[j].count * element_bytes(leaves_[j].type) < sharded_pack_limit;
  }

  // Whether leaf j may join the bucket of leaf `next` (j + 1): GPU leaves only where no packing
  // is needed (adjacent leaves of an all-reduce).
  bool joins(std::size_t j, std::size_t next) const noexcept {
    if constexpr (on_device()) {
      return !Sharded && adjacent(j, next);
    } else {
      return true;
    }
  }

  // Leaf j's elements end where leaf j + 1's begin (same element type).
  bool adjacent(std::size_t j, std::size_t next) const noexcept {
    return static_cast<const char*>(leaves_[j].data) + leaves_[j].count * element_bytes(leaves_[j].type) ==
           static_cast<const char*>(leaves_[next].data);
  }

  static std::size_t element_bytes(unsigned type) {
    std::size_t bytes = 0;
    with_type(type, [&]<class E>() { bytes = sizeof(E); });
    return bytes;
  }

  void start(std::size_t b) {
    reread_leaves(b);
    const bucket& B = buckets_[b];
    with_type(B.type, [&]<class E>() {
      E* data = static_cast<E*>(leaves_[B.first].data);  // one leaf, or adjacent ones
      if (B.packed) {
        E* const out = std::get<index_of<E>()>(*staging_).data() + B.offset;
        if constexpr (Sharded) {
          pack_by_replica(B, out);
        } else {
          std::size_t at = 0;
          for (std::size_t k = B.first; k <= B.last; ++k) {
            if (leaves_[k].count != 0) std::memcpy(out + at, leaves_[k].data, leaves_[k].count * sizeof(E));
            at += leaves_[k].count;
          }
        }
        data = out;
      }
      naming_leaves(b, [&] {
        std::get<index_of<E>()>(pending_)[b].emplace(
            std::get<index_of<E>()>(starters_)(context_, op_, data, span_of(B), where_));
      });
    });
  }

  // Bucket b's leaves as grads holds them now. The natural backward pass assigns a new vector
  // to a leaf (`std::get<1>(g) = layer.backward()`), which frees the buffer the plan recorded:
  // reading that one would reduce freed memory. A leaf of the same size that moved is read where
  // it is now, and so is a run of adjacent leaves that moved together (spans re-cut from another
  // flat buffer); a leaf whose size changed, or that left an in-place run, is an error before
  // anything is posted.
  void reread_leaves(std::size_t b) {
    const bucket& B = buckets_[b];
    bool moved = false;
    for (std::size_t k = B.first; k <= B.last; ++k) {
      const leaf& f = leaves_[k];
      void* data = nullptr;
      std::size_t count = 0;
      f.read(f.object, data, count);
      moved = moved || data != f.data;
      if (count != f.count) {
        throw_moved(b, k, f.type_name(), detail::format("has %zu elements now, %zu then", count, f.count).c_str());
      }
    }
    if (!moved) return;  // the usual case: nothing allocated, nothing written
    std::vector<void*> at(B.last - B.first + 1);
    for (std::size_t k = B.first; k <= B.last; ++k) {
      std::size_t count = 0;
      leaves_[k].read(leaves_[k].object, at[k - B.first], count);
    }
    // An in-place run of several leaves must still be one run: each leaf where the last ends.
    if (!B.packed && B.first != B.last) {
      for (std::size_t k = B.first; k < B.last; ++k) {
        if (static_cast<const char*>(at[k - B.first]) + leaves_[k].count * element_bytes(leaves_[k].type) !=
            static_cast<const char*>(at[k + 1 - B.first])) {
          throw_moved(b, k + 1, leaves_[k + 1].type_name(),
                      "moved out of the run of adjacent leaves its bucket reduces in place");
        }
      }
    }
    for (std::size_t k = B.first; k <= B.last; ++k) leaves_[k].data = at[k - B.first];
  }

  [[noreturn]] void throw_moved(std::size_t b, std::size_t k, const std::string& type, const char* how) const {
    throw error(detail::format(
        "mirror::GradientBuckets at %s (replica %d): leaf %zu of grads (%s) %s since gradient_buckets() was "
        "called, and bucket %zu was planned on it; assign into the leaf's existing buffer (std::copy, or "
        "Eigen's .noalias() into a map of it), or call gradient_buckets() after the leaves have their final "
        "buffers",
        detail::site_text(where_).c_str(), replica_, k, type.c_str(), how, b));
  }

  // The sharded form's packing: block q holds every leaf's cut q, each zero-padded to the
  // leaf's largest cut, so that the packed span's cut q (of B.block elements) is block q.
  template <class E>
  void pack_by_replica(const bucket& B, E* out) const {
    for (int q = 0; q < replicas_; ++q) {
      for (std::size_t k = B.first; k <= B.last; ++k) {
        const auto cut = backend::cut_of(leaves_[k].count, replicas_, q);
        const std::size_t width = backend::cut_of(leaves_[k].count, replicas_, 0).second;
        if (cut.second != 0) std::memcpy(out, static_cast<const E*>(leaves_[k].data) + cut.first, cut.second * sizeof(E));
        for (std::size_t i = cut.second; i < width; ++i) out[i] = E{};
        out += width;
      }
    }
  }

  void unpack(const bucket& B) {
    with_type(B.type, [&]<class E>() {
      const E* in = std::get<index_of<E>()>(*staging_).data() + B.offset;
      if constexpr (Sharded) {
        // Only this replica's block holds results: its cut of each leaf.
        in += B.block * static_cast<std::size_t>(replica_);
        for (std::size_t k = B.first; k <= B.last; ++k) {
          const auto cut = backend::cut_of(leaves_[k].count, replicas_, replica_);
          if (cut.second != 0) std::memcpy(static_cast<E*>(leaves_[k].data) + cut.first, in, cut.second * sizeof(E));
          in += backend::cut_of(leaves_[k].count, replicas_, 0).second;
        }
        return;
      }
      for (std::size_t k = B.first; k <= B.last; ++k) {
        if (leaves_[k].count != 0) std::memcpy(leaves_[k].data, in, leaves_[k].count * sizeof(E));
        in += leaves_[k].count;
      }
    });
  }

  // The packed buffers: the thread's own for this nest type while no other object of it holds
  // them (a training loop's steps), else this object's.
  struct thread_staging {
    typename storage::staging buffers;
    bool in_use = false;
    // The last plan made on this thread (plan_once), with what it was made for.
    bool planned = false;
    std::size_t plan_cap = 0;
    int plan_replicas = 0;
    std::vector<leaf> plan_leaves;  // (their `ready` flags all false)
    std::vector<bucket> plan_buckets;
    std::vector<std::size_t> plan_staged;
  };
  static thread_staging& kept() {
    static thread_local thread_staging s;
    return s;
  }
  void take_staging() {
    thread_staging& k = kept();
    if (!k.in_use) {
      k.in_use = true;
      staging_ = &k.buffers;
      borrowed_ = true;
    } else {
      staging_ = &own_;
    }
    [&]<class... Es>(detail::type_list<Es...>) {
      ((std::get<index_of<Es>()>(*staging_).size() < staged_[index_of<Es>()]
            ? std::get<index_of<Es>()>(*staging_).resize(staged_[index_of<Es>()])
            : void()),
       ...);
    }(detail::element_types_t<T>{});
  }
  void release_staging() noexcept {
    if (borrowed_) kept().in_use = false;
    borrowed_ = false;
  }

  void* context_;
  detail::async_queue* queue_;  // the replica's: dropped_error() goes there
  int exceptions_ = std::uncaught_exceptions();  // a drop by unwinding is the unwound error's
  ReduceOp op_;
  mirror::source_location where_;
  T* grads_;
  int replicas_;  // num_replicas_in_sync: the parts a reduce-scatter cuts
  int replica_;   // replica_id_in_sync_group: this replica's cut
  std::vector<leaf> leaves_;
  std::vector<bucket> buckets_;
  std::vector<std::size_t> staged_;  // per element type: the packed buffers' elements
  std::size_t next_ = 0;             // the next bucket to start
  std::size_t waited_ = 0;           // the buckets before it were waited for (and unpacked)
  bool finished_ = false;
  typename storage::starters starters_{};
  typename storage::staging own_;
  typename storage::staging* staging_ = nullptr;
  bool borrowed_ = false;
  // Last: destroyed first, so a bucket still in flight completes while its buffers live.
  typename storage::pending pending_;
};

}  // namespace mirror
