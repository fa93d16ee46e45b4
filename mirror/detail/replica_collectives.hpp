// SPDX-License-Identifier: Apache-2.0
#pragma once
// The collectives layer: what one replica's collective call does between its ReplicaContext
// and the strategy's ops policy. The context turns a nest into leaves of each element type and
// an agreement header; this layer attaches the leaves on the replica's device, hands them to
// the ops policy (all_reduce, reduce_scatter, all_gather) or moves them itself (broadcast,
// merge_call, all_gather's counts), and crosses workers where the runtime spans processes. Each
// call goes one way: context, then this layer, then the ops policy, then the runtime
// (docs/design.md#the-data-path).

#include <array>
#include <cstddef>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <mirror/concepts/device.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/for_all_replicas.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/error.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::detail {

/// One replica's view of the collectives of a strategy whose runtime is `Rt` and whose ops
/// policy is `Ops`. Cheap to make (two references): each ReplicaContext holds one.
template <class Rt, class Ops>
class replica_collectives {
 private:
  // The leaves of one element type of a collective's input or output, attached on a replica's
  // device (rt.attach) as an ops policy sees them.
  template <class E, std::size_t K>
  struct attached_leaves {
    std::array<typename Rt::template pointer<E>, K> leaves{};
    std::array<std::size_t, K> sizes{};
    std::size_t total = 0;
    backend::segment_list<Rt, E> list() const { return {leaves, sizes, total}; }
  };

 public:
  /// Whether the runtime's replicas span several processes (devices::Cluster).
  static constexpr bool multi_worker = spans_workers<Rt>;

  replica_collectives(Rt& rt, const Ops& ops) noexcept : rt_(rt), ops_(ops) {}

  /// ReplicaContext::all_reduce's leaves of element type E: attached, reduced by the ops
  /// policy in place, detached. `header` (the call's agreement check) rides on the policy's
  /// first exchange; null for the second and later element types of one call.
  template <class E, std::size_t K>
  void all_reduce_leaves(int self, ReduceOp op, const std::array<std::span<E>, K>& host,
                         const collective_header* header) {
    // Host devices combine with CPU arithmetic (element_ops.hpp). Other devices combine with
    // their own kernels, and their runtime names the element types it has (CUDA: also
    // mirror::cuda::half and bfloat16, which are no C++ arithmetic types).
    if constexpr (Rt::host_addressable) require_host_element<E>();
    const auto leaves = attach_leaves(self, host);
    backend::collective<Rt> c(rt_, self, header);
    ops_.all_reduce(c, op, leaves.list());
    detach_leaves(self, leaves, host);
  }

  /// Whether the ops policy can start an all-reduce that completes later
  /// (`all_reduce_start`: ops::Hierarchical across workers, ops::NcclAllReduce on its
  /// communication stream), so that ReplicaContext::all_reduce_async overlaps; other policies
  /// complete it as it starts.
  static constexpr bool starts_all_reduce =
      requires(const Ops& o, backend::collective<Rt>& c, const backend::segment_list<Rt, float>& s) {
        o.all_reduce_start(c, ReduceOp::sum, s).finish();
      };

  /// One replica's collective of element type E (K leaves per set), started: the ops policy's
  /// part (`Started`, its finish() completes it) and the `Sets` attached sets of leaves (an
  /// all-reduce's one, a reduce-scatter's input and output), detached in order once it has
  /// finished (a staged host leaf of a GPU replica is copied back then).
  template <class E, std::size_t K, class Started, std::size_t Sets = 1>
  class started_leaves {
   public:
    /// Nothing started.
    started_leaves() = default;
    /// The policy's part `op` of the collective of `host`, attached as `leaves`.
    started_leaves(replica_collectives& owner, int self, const std::array<attached_leaves<E, K>, Sets>& leaves,
                   const std::array<std::array<std::span<E>, K>, Sets>& host, Started op)
        : owner_(&owner), self_(self), leaves_(leaves), host_(host), op_(std::move(op)) {}
    /// Takes over `other`'s part.
    started_leaves(started_leaves&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)), self_(other.self_), leaves_(other.leaves_),
          host_(other.host_), op_(std::move(other.op_)) {}
    /// (Assigned only while empty: ReplicaContext fills its parts once.)
    started_leaves& operator=(started_leaves&& other) noexcept {
      owner_ = std::exchange(other.owner_, nullptr);
      self_ = other.self_;
      leaves_ = other.leaves_;
      host_ = other.host_;
      op_ = std::move(other.op_);
      return *this;
    }
    /// Whether finish() would return without waiting.
    bool done() const noexcept { return op_.done(); }
    /// Completes the policy's part and detaches the leaves. Once.
    void finish() {
      op_.finish();
      if (owner_ == nullptr) return;
      replica_collectives* const owner = std::exchange(owner_, nullptr);
      for (std::size_t i = 0; i < Sets; ++i) owner->detach_leaves(self_, leaves_[i], host_[i]);
    }

   private:
    replica_collectives* owner_ = nullptr;  // null: nothing attached (empty, or finished)
    int self_ = 0;
    std::array<attached_leaves<E, K>, Sets> leaves_{};
    std::array<std::array<std::span<E>, K>, Sets> host_{};
    Started op_{};
  };

  /// What all_reduce_start returns for element type E and K leaves (`::type`): finish()
  /// completes it. (A class, not an alias: its body is looked at only where a policy starts.)
  template <class E, std::size_t K>
  struct started_all_reduce {
    /// The started part.
    using type = started_leaves<
        E, K,
        decltype(std::declval<const Ops&>().all_reduce_start(std::declval<backend::collective<Rt>&>(), ReduceOp::sum,
                                                             std::declval<const backend::segment_list<Rt, E>&>()))>;
  };

  /// all_reduce_leaves, started (where starts_all_reduce): the leaves hold the result once the
  /// returned part's finish() has returned.
  template <class E, std::size_t K>
  auto all_reduce_start(int self, ReduceOp op, const std::array<std::span<E>, K>& host,
                        const collective_header* header) {
    if constexpr (Rt::host_addressable) require_host_element<E>();
    const auto leaves = attach_leaves(self, host);
    backend::collective<Rt> c(rt_, self, header);
    return typename started_all_reduce<E, K>::type(*this, self, std::array{leaves},
                                                   std::array<std::array<std::span<E>, K>, 1>{host},
                                                   ops_.all_reduce_start(c, op, leaves.list()));
  }

  /// Whether the ops policy can start a reduce-scatter that completes later
  /// (`reduce_scatter_start`: ops::Hierarchical across workers), so that
  /// ReplicaContext::reduce_scatter_async overlaps; other policies complete it as it starts.
  static constexpr bool starts_reduce_scatter =
      requires(const Ops& o, backend::collective<Rt>& c, const backend::segment_list<Rt, float>& s) {
        o.reduce_scatter_start(c, ReduceOp::sum, s, s).finish();
      };

  /// What reduce_scatter_start returns for element type E and K leaves (`::type`).
  template <class E, std::size_t K>
  struct started_reduce_scatter {
    /// The started part (input and output leaves attached).
    using type = started_leaves<
        E, K,
        decltype(std::declval<const Ops&>().reduce_scatter_start(
            std::declval<backend::collective<Rt>&>(), ReduceOp::sum, std::declval<const backend::segment_list<Rt, E>&>(),
            std::declval<const backend::segment_list<Rt, E>&>())),
        2>;
  };

  /// reduce_scatter_leaves, started (where starts_reduce_scatter): `out` holds this replica's
  /// cuts once the returned part's finish() has returned.
  template <class E, std::size_t K>
  auto reduce_scatter_start(int self, ReduceOp op, const std::array<std::span<E>, K>& in,
                            const std::array<std::span<E>, K>& out, const collective_header* header) {
    if constexpr (Rt::host_addressable) require_host_element<E>();
    const auto ins = attach_leaves(self, in);
    const auto outs = attach_leaves(self, out);
    backend::collective<Rt> c(rt_, self, header);
    return typename started_reduce_scatter<E, K>::type(*this, self, std::array{ins, outs}, std::array{in, out},
                                                       ops_.reduce_scatter_start(c, op, ins.list(), outs.list()));
  }

  template <class E, std::size_t K>
  void reduce_scatter_leaves(int self, ReduceOp op, const std::array<std::span<E>, K>& in,
                             const std::array<std::span<E>, K>& out, const collective_header* header) {
    static_assert(requires(const Ops& o, backend::collective<Rt>& c,
                           const backend::segment_list<Rt, E>& s) { o.reduce_scatter(c, op, s, s); },
                  "mirror::ReplicaContext::reduce_scatter: this strategy's ops policy has no reduce_scatter "
                  "(mirror/concepts/cross_device_ops.hpp); every policy mirror ships has one, and a policy of "
                  "your own can call generic_reduce_scatter");
    if constexpr (Rt::host_addressable) require_host_element<E>();
    const auto ins = attach_leaves(self, in);
    const auto outs = attach_leaves(self, out);
    backend::collective<Rt> c(rt_, self, header);
    ops_.reduce_scatter(c, op, ins.list(), outs.list());
    // The inputs first: where a device staged a span and its cut apart, the cut's result lands last.
    detach_leaves(self, ins, in);
    detach_leaves(self, outs, out);
  }

  /// ReplicaContext::all_gather's leaves of element type E: `in` is attached read-only (the
  /// policy sees `backend::const_segment_list`, and nothing is written back to it), `out` is
  /// attached, filled by the policy and detached.
  template <class E, std::size_t K>
  void all_gather_leaves(int self, const std::array<std::span<const E>, K>& in, std::span<const std::size_t> counts,
                         const std::array<std::span<E>, K>& out, const collective_header* header) {
    static_assert(requires(const Ops& o, backend::collective<Rt>& c, const backend::const_segment_list<Rt, E>& i,
                           const backend::segment_list<Rt, E>& s) { o.all_gather(c, i, counts, s); },
                  "mirror::ReplicaContext::all_gather: this strategy's ops policy has no all_gather "
                  "(mirror/concepts/cross_device_ops.hpp); every policy mirror ships has one, and a policy of "
                  "your own can call generic_all_gather");
    if constexpr (Rt::host_addressable) require_host_element<E>();
    const auto ins = attach_leaves(self, in);
    const auto outs = attach_leaves(self, out);
    // (No header where gather_counts made the agreement check.)
    backend::collective<Rt> c(rt_, self, header);
    ops_.all_gather(c, ins.list(), counts, outs.list());
    detach_leaves(self, ins, in);  // a read-only leaf: released, not copied back
    detach_leaves(self, outs, out);
  }

  /// all_gather's first step (ReplicaContext::gather_counts): every replica's `leaves` lengths
  /// into `all` (replica-major), the agreement check, and the checks of the widths, the element
  /// kinds and the span form's out size, which every replica makes alike: all throw the same
  /// shape_error. `data` (`data_bytes`): the replica's one leaf, where there is one leaf (else
  /// null): across workers a small block of them travels with the counts (worker_group).
  void gather_counts(int self, const collective_header& header, const std::size_t* counts,
                     const std::size_t* widths, const std::size_t* kinds, std::size_t leaves, std::size_t out_size,
                     const void* data, std::size_t data_bytes, std::vector<std::size_t>& all) {
    struct post {
      const std::size_t* counts;
      const std::size_t* widths;
      const std::size_t* kinds;
      std::size_t out_size;
      const void* data;
      std::size_t data_bytes;
    };
    backend::collective<Rt> c(rt_, self, &header);
    const auto posts = c.exchange(post{counts, widths, kinds, out_size, data, data_bytes});
    // Per replica: its lengths, each leaf's width and element kind in one word (the kind in the
    // top 16 bits), its out size; every replica (of every worker) checks the same table, so all
    // throw the same shape_error or none does. The kinds can differ only between workers (one
    // worker's replicas run one nest type), where blocks of another element type would be taken
    // for this one's bytes: the table checks them there, with no exchange of its own.
    const std::size_t words = 2 * leaves + 1;
    std::vector<std::size_t> local(posts.size() * words);
    for (std::size_t r = 0; r < posts.size(); ++r) {
      for (std::size_t k = 0; k < leaves; ++k) {
        local[r * words + k] = posts[r].counts[k];
        local[r * words + leaves + k] = posts[r].widths[k] | posts[r].kinds[k] << kind_shift;
      }
      local[r * words + 2 * leaves] = posts[r].out_size;
    }
    const std::vector<std::size_t>* table = &local;
    [[maybe_unused]] std::vector<std::size_t> global;
    if constexpr (multi_worker) {
      // Worker w's replicas are global replicas w*R .. w*R+R-1: one all-gather of every
      // worker's table is the global table, in global replica order. Replica 0 makes it; the
      // others read it from its frame. With one host leaf, the worker's block (its replicas'
      // leaves in turn) is offered to travel with it.
      if (self == 0) {
        global.resize(local.size() * static_cast<std::size_t>(rt_.workers()->num_workers()));
        std::size_t block_bytes = worker_group::no_block;
        std::array<unsigned char, worker_group::carried_block_max> block;
        if constexpr (Rt::host_addressable) {
          if (leaves == 1) {
            block_bytes = 0;
            for (std::size_t r = 0; r < posts.size(); ++r) block_bytes += posts[r].data_bytes;
            if (block_bytes <= block.size()) {
              for (std::size_t r = 0, at = 0; r < posts.size(); at += posts[r].data_bytes, ++r) {
                if (posts[r].data_bytes != 0) std::memcpy(block.data() + at, posts[r].data, posts[r].data_bytes);
              }
            }
          }
        }
        c.for_all_replicas([&] {
          all_gather_counts_across_workers(*rt_.workers(), local, global, "mirror::ReplicaContext::all_gather",
                                           block_bytes <= block.size() ? block.data() : nullptr, block_bytes);
        });
      }
      struct shared {
        const std::vector<std::size_t>* table;
      };
      table = c.exchange(shared{&global})[0].table;
    }
    const std::size_t n = table->size() / words;
    const auto word = [&](std::size_t r, std::size_t i) { return (*table)[r * words + i]; };
    all.resize(n * leaves);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t k = 0; k < leaves; ++k) all[r * leaves + k] = word(r, k);
    }
    std::string problem;
    const auto width = [&](std::size_t r, std::size_t k) { return word(r, leaves + k) & width_mask; };
    const auto kind = [&](std::size_t r, std::size_t k) { return word(r, leaves + k) >> kind_shift; };
    for (std::size_t r = 1; r < n && problem.empty(); ++r) {
      for (std::size_t k = 0; k < leaves; ++k) {
        if (kind(r, k) != kind(0, k)) {
          problem = format("mirror::ReplicaContext::all_gather: leaf %zu holds %s elements on replica %zu (worker "
                           "%zu) but %s on replica 0 (worker 0); every worker must gather the same element types",
                           k, kind_name(element_kind::from_code(kind(r, k))).c_str(), r, r / posts.size(),
                           kind_name(element_kind::from_code(kind(0, k))).c_str())
                        .c_str();
          break;
        }
        if (width(r, k) != width(0, k)) {
          problem = format("mirror::ReplicaContext::all_gather: leaf %zu (%s) has rows of %zu elements on "
                                   "replica %zu but of %zu on replica 0; all_gather concatenates along the first "
                                   "dimension only, so every replica's rows must be equally wide",
                                   k, demangle(header.leaf_types[k]->name()).c_str(), width(r, k), r, width(0, k))
                        .c_str();
          break;
        }
      }
    }
    if (problem.empty() && leaves == 1) {
      std::size_t total = 0;
      for (std::size_t r = 0; r < n; ++r) total += word(r, 0);
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t out = word(r, 2 * leaves);
        if (out != any_size && out != total) {
          problem = format("mirror::ReplicaContext::all_gather(in, out, axis0) on replica %zu: out has %zu "
                                   "elements but the replicas' inputs have %zu in all; pass an out span of %zu",
                                   r, out, total, total)
                        .c_str();
          break;
        }
      }
    }
    if (multi_worker && problem.empty()) rt_.barrier(self);  // replica 0's table is read until here
    if (!problem.empty()) {
      rt_.barrier(self);  // every replica has read the others' frames before any unwinds
      throw shape_error(problem);
    }
  }

  /// gather_counts' table holds a leaf's row width and element kind in one word: the kind
  /// (element_kind::code(), 16 bits) above this bit, the width below.
  static constexpr unsigned kind_shift = 48;
  static constexpr std::size_t width_mask = (std::size_t{1} << kind_shift) - 1;

  /// A broadcast of at most this many bytes, on host leaves none of which is resizable, carries
  /// the source's bytes in its one exchange (broadcast_bytes).
  static constexpr std::size_t small_broadcast_bytes = 64;
  /// Such a broadcast's payload: the source's leaves packed (ReplicaContext::local_broadcast).
  struct small_broadcast_line {
    alignas(16) unsigned char data[small_broadcast_bytes];
  };

  // The source's line rides in the exchange that checks the call: one barrier, where
  // exchange_sizes and broadcast_leaves take three. The others take it in place of theirs. Read
  // after the exchange, like the all-reduce's latency path: a replica's slot keeps its payload
  // until the next exchange, which cannot complete before every replica has returned from this one.
  void broadcast_bytes(int self, int from, const collective_header& header, small_broadcast_line& line) {
    backend::collective<Rt> c(rt_, self, &header);
    const auto all = c.exchange(line);
    if (self != from) line = all[static_cast<std::size_t>(from)];
  }

  const std::size_t* exchange_sizes(int self, const collective_header& header, const std::size_t* sizes) {
    backend::collective<Rt> c(rt_, self, &header);
    const auto all = c.exchange(sizes);
    return all[static_cast<std::size_t>(header.param)];
  }

  template <class E, std::size_t K>
  void broadcast_leaves(int self, int from, const std::array<std::span<E>, K>& host) {
    using pointer = typename Rt::template pointer<E>;
    std::array<pointer, K> leaves{};
    for (std::size_t k = 0; k < K; ++k) leaves[k] = rt_.attach(self, host[k]);
    const auto all = rt_.exchange(self, static_cast<const pointer*>(leaves.data()));
    if (self != from) {
      const pointer* source = all[static_cast<std::size_t>(from)];
      for (std::size_t k = 0; k < K; ++k) rt_.copy(self, leaves[k], source[k], host[k].size());
    }
    rt_.barrier(self);  // the source's buffers stay valid until every copy is done
    for (std::size_t k = 0; k < K; ++k) rt_.detach(self, leaves[k], host[k]);
  }

  /// ReplicaContext::merge_call: every replica's `mine` (the address of its arguments) reaches
  /// replica 0, which calls `body(all)` (returning the address of its result, or null); every
  /// replica gets that address, valid until end_merge. An exception from `body` is rethrown on
  /// replica 0 and cancels the others.
  template <class Body>
  const void* merge(int self, const collective_header& header, const void* mine, Body&& body) {
    backend::collective<Rt> c(rt_, self, &header);
    const auto all = c.exchange(mine);
    struct outcome {
      const void* value;                 // the result, on replica 0's frame
      const std::exception_ptr* failed;  // non-null when body threw
    };
    outcome o{nullptr, nullptr};
    std::exception_ptr failure;
    if (self == 0) {
      std::vector<const void*> args(all.size());
      for (std::size_t r = 0; r < all.size(); ++r) args[r] = all[r];
      try {
        o.value = body(std::span<const void* const>(args));
      } catch (...) {
        failure = std::current_exception();
        o.failed = &failure;
      }
    }
    const auto outcomes = rt_.exchange(self, o);
    if (outcomes[0].failed != nullptr) {
      if (self == 0) std::rethrow_exception(failure);
      throw backend::collective_cancelled_rethrow_me{};
    }
    return outcomes[0].value;
  }

  /// merge_call's end: replica 0's result stays valid until every replica has copied it.
  void end_merge(int self) { rt_.barrier(self); }

  /// Before ReplicaContext::broadcast writes anything on a multi-worker strategy: the local
  /// replicas check that they agree (`header`: the call, the global source, the sizes of the
  /// leaves that cannot resize), then replica 0 of every worker checks the same across workers.
  /// A disagreement is a shape_error on every replica of every worker (a local one reaches the
  /// other workers through report_failure) before any buffer changes.
  void check_broadcast(int self, const collective_header& header, int root) {
    backend::collective<Rt> c(rt_, self, &header);
    c.barrier();
    if (self == 0) {
      c.for_all_replicas([&] {
        rt_.workers()->check_broadcast(header.sizes, header.num_leaves, root, "mirror::ReplicaContext::broadcast",
                                       text_hash(header.nest->name()));
      });
    }
  }

  /// The cross-worker part of ReplicaContext::broadcast: worker `root`'s replica 0 sends to every
  /// worker's replica 0. The other replicas wait in the local broadcast that follows.
  template <class N>
  void cross_broadcast(int self, N& value, int root) {
    if (self == 0) {
      for_all_replicas(rt_, [&] { broadcast_nest(*rt_.workers(), value, root, "mirror::ReplicaContext::broadcast"); });
    }
  }

 private:
  template <class E, std::size_t K>
  attached_leaves<E, K> attach_leaves(int self, const std::array<std::span<E>, K>& host) {
    attached_leaves<E, K> a;
    for (std::size_t k = 0; k < K; ++k) {
      a.leaves[k] = rt_.attach(self, host[k]);
      a.sizes[k] = host[k].size();
      a.total += a.sizes[k];
    }
    return a;
  }
  template <class E, std::size_t K>
  void detach_leaves(int self, const attached_leaves<E, K>& a, const std::array<std::span<E>, K>& host) {
    for (std::size_t k = 0; k < K; ++k) rt_.detach(self, a.leaves[k], host[k]);
  }


  Rt& rt_;
  const Ops& ops_;
};

}  // namespace mirror::detail
