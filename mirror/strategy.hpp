// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::Strategy<Device, Ops>`: synchronous data parallelism over the replicas of a device.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <mirror/source_location.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/axis.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/concepts/nest.hpp>
#include <mirror/default_device.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/detail/access.hpp>
#include <mirror/detail/timeline.hpp>
#include <mirror/flight_recorder.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/host_reduce.hpp>
#include <mirror/detail/lean_ranges.hpp>  // <ranges>: the parts used
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/rethrow_first.hpp>
#include <mirror/detail/run_plumbing.hpp>
#include <mirror/detail/run_result.hpp>
#include <mirror/error.hpp>
#include <mirror/distributed_dataset.hpp>
#include <mirror/input_context.hpp>
#include <mirror/value_context.hpp>
#include <mirror/detail/gathered.hpp>
#include <mirror/mirrored.hpp>
#include <mirror/mirrored_variable.hpp>
#include <mirror/sync_on_read_variable.hpp>
#include <mirror/variable_aggregation.hpp>
#include <mirror/per_replica.hpp>
#include <mirror/reduce_op.hpp>
#include <mirror/replica_context.hpp>
#include <mirror/detail/staged_argument.hpp>
#include <mirror/synced.hpp>

namespace mirror {

/// Synchronous data parallelism: `run(fn, args...)` calls `fn` once on every replica of
/// `Device`, concurrently, and cross-replica reductions go through `Ops`.
///
/// **Template parameters.** `Device` models `mirror::device` (`devices::Threads`, `devices::Cuda`);
/// `Ops` models `mirror::cross_device_ops<Device>` (`ops::ReductionToOneDevice`,
/// `ops::HierarchicalCopy`, `ops::NcclAllReduce`, or `default_ops_t<Device>`, the fastest
/// correct choice). Swapping either is a one-word change of the `using` line.
///
/// **Example** (`examples/overview.cpp`):
/// \code
/// mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 4}};
/// auto sums = strategy.run([](auto& ctx) {
///   return ctx.all_reduce(mirror::ReduceOp::sum, ctx.replica_id_in_sync_group());
/// });                                                // Mirrored<int>, every copy 0+1+2+3
/// \endcode
///
/// One `run` at a time: concurrent calls from several threads are serialised. A `Strategy` owns
/// its device runtime (threads, streams) and is neither copyable nor movable.
template <class Device = devices::Default, class Ops = default_ops_t<Device>>
class Strategy {
  static_assert(device<Device>,
                "mirror::Strategy<Device, Ops>: Device must model mirror::device "
                "(mirror/concepts/device.hpp); use mirror::devices::Threads on the CPU");
  static_assert(cross_device_ops<Ops, Device>,
                "mirror::Strategy<Device, Ops>: Ops must model mirror::cross_device_ops<Ops, Device> "
                "(mirror/concepts/cross_device_ops.hpp); ops::ReductionToOneDevice works on every device");
  static_assert(!detail::spans_workers<runtime_t<Device>> || requires { requires Ops::crosses_workers; },
                "mirror::Strategy<devices::Cluster<Local>, Ops>: Ops reduces only among one worker's replicas, so "
                "all_reduce would silently skip the other workers; use default_ops_t<devices::Cluster<Local>> "
                "(ops::Hierarchical on Threads, ops::NcclAllReduce on Cuda), or ops::Hierarchical<YourLocalOps>");

 public:
  using device_type = Device;                      ///< the device policy
  using ops_type = Ops;                            ///< the cross-device ops policy
  using runtime_type = runtime_t<Device>;          ///< the device's runtime (threads, streams), see runtime()
  using context_type = ReplicaContext<Strategy>;   ///< what `fn` receives as `auto& ctx`
  /// True when the device spans several processes (`devices::Cluster`, backends/mpi): then
  /// N = W*R replicas are in sync, R of them in this process.
  static constexpr bool multi_worker = detail::spans_workers<runtime_type>;

  /// Starts the device runtime (a thread pool on `devices::Threads`).
  /// **Errors**: `std::invalid_argument` for an invalid device or ops setting (the message names
  /// the field and its valid range).
  explicit Strategy(Device device = {}, Ops ops = {})
      : rt_(device), ops_(std::move(ops)), errors_(static_cast<std::size_t>(rt_.num_replicas())) {
    if constexpr (requires { ops_.validate(rt_); }) ops_.validate(rt_);
    if (const char* path = std::getenv("MIRROR_TIMELINE"); path != nullptr && path[0] != '\0') set_timeline(path);
  }
  /// Ends the timeline file, if one is being written.
  ~Strategy() { set_timeline(std::string()); }
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  /// The number of replicas in sync: those `run` calls `fn` on, in every worker (W*R on a
  /// multi-worker device, R otherwise).
  int num_replicas_in_sync() const noexcept { return rt_.num_replicas() * num_workers(); }

  /// The replicas in this process (R): the components of a `PerReplica` or `Mirrored`, the
  /// copies of a variable. Equal to `num_replicas_in_sync()` in a single process.
  int num_local_replicas() const noexcept { return rt_.num_replicas(); }
  /// The number of worker processes W (1 unless the device is `devices::Cluster`).
  int num_workers() const noexcept {
    if constexpr (multi_worker) {
      return rt_.workers()->num_workers();
    } else {
      return 1;
    }
  }
  /// This process's worker index w; its replicas are w*R .. w*R + R - 1.
  int worker_index() const noexcept {
    if constexpr (multi_worker) {
      return rt_.workers()->worker_index();
    } else {
      return 0;
    }
  }
  /// True on worker 0, the one that writes checkpoints (TF's `is_chief` with no chief job).
  bool is_chief() const noexcept { return worker_index() == 0; }

  /// Calls `fn` once on every replica, concurrently, and returns when all have returned.
  ///
  /// `fn` may take the replica context first (`[](auto& ctx, ...)`); it is passed exactly when
  /// `fn(ctx, args...)` is well-formed. Replica i receives component i of a `PerReplica`
  /// argument (as `T&` for a non-const lvalue, else `const T&`), its copy of a `Mirrored`
  /// argument (`const T&`), a replica-local handle (a non-const lvalue) for a variable, and
  /// every other argument itself, shared, as `const&` — except on a device whose memory the
  /// replicas' threads cannot read (`devices::Cuda`), where a shared nest of host arrays and
  /// scalars is copied to each replica's device first and arrives as the same shape of device
  /// views (docs/cuda.md\#host-arguments-of-run; mirror/detail/staged_argument.hpp). `fn` is called
  /// from several threads at once: it must not mutate captured state without synchronisation.
  ///
  /// **Returns**: `void` if `fn` does; `Mirrored<T>` if `fn` returns `Synced<T>`; a tuple
  /// (`std::tuple`, `std::pair`, `boost::hana::tuple`) lifted element by element; otherwise
  /// `PerReplica<T>`.
  /// **Errors**: an exception thrown by `fn` on any replica cancels the other replicas'
  /// collectives and is rethrown once every replica has returned: a `mirror::error` as itself,
  /// anything else as `mirror::replica_error` naming the replica, with the original nested. When
  /// several replicas fail, the lowest replica id's error is reported. The strategy stays usable.
  /// On a multi-worker device the other workers are told at once (their pending and later
  /// cross-worker collectives of this run throw `replica_error`), and every worker completes this
  /// run's cross-worker collectives before it posts a later one, so the next `run` works on every
  /// worker (after a timeout or an MPI error it cannot: docs/multi-worker.md).
  /// Calling `run` from inside `fn` throws `mirror::error`. A `PerReplica` argument whose size is
  /// not `num_replicas_in_sync()` (or a variable made by a strategy with another replica
  /// count) throws `mirror::shape_error` before any replica starts.
  template <class F, class... Args>
  auto run(F&& fn, Args&&... args) {
    using Result = std::decay_t<decltype(detail::call_fn(rt_, fn, std::declval<context_type&>(), 0, args...))>;
    static_assert(!detail::is_pending<Result>::value,
                  "mirror::Strategy::run(fn, args...): fn returns a mirror::Pending, which is valid only inside fn; "
                  "return what its wait() gives instead");
    if (rt_.in_parallel()) throw_nested_run();
    std::lock_guard lock(run_mutex_);
    // Multi-worker: a failure belongs to this run, and so does a refused argument: the run is
    // counted either way, so that runs keep pairing by their count on every worker.
    const detail::run_phases phases(workers_or_null());
    std::size_t index = 0;
    (check_components(args, index++), ...);
    detail::recorder_writer::next_run(recorder_);
    const int n = num_local_replicas();
    detail::replica_errors& errors = errors_;  // reused: runs are serialised
    if constexpr (std::is_void_v<Result>) {
      rt_.parallel([&](int r) noexcept {
        detail::guarded(rt_, errors, r, first_local_replica(), [&] {
          context_type ctx(*this, r, recorder_, timeline_.replica_track(r));
          detail::call_fn(rt_, fn, ctx, r, args...);
          ctx.finish_started();
        });
      });
      timeline_.drain_if_full();
      rethrow_first(errors);
    } else if constexpr (detail::keeps_results_in_areas<runtime_type, Result>) {
      // Each replica builds its result in the runtime's result area, on the line the caller
      // reads anyway to see that the replica finished: a worker writing into a vector of the
      // caller's costs two more cache-line hand-offs (the line's ownership, then the read).
      // Allocated before the call: nothing after it may throw.
      typename detail::run_result<Result>::collector out(static_cast<std::size_t>(n));
      rt_.parallel([&](int r) noexcept {
        auto* mine = ::new (rt_.result_area(r)) std::optional<Result>();
        detail::guarded(rt_, errors, r, first_local_replica(), [&] {
          context_type ctx(*this, r, recorder_, timeline_.replica_track(r));
          mine->emplace(detail::call_fn(rt_, fn, ctx, r, args...));
          ctx.finish_started();
        });
      });
      for (int r = 0; r < n; ++r) {
        auto* theirs = std::launder(static_cast<std::optional<Result>*>(rt_.result_area(r)));
        if (theirs->has_value()) out.take(r, std::move(**theirs));  // nothrow: keeps_results_in_areas
        theirs->~optional();
      }
      timeline_.drain_if_full();
      rethrow_first(errors);
      return std::move(out).finish();
    } else {
      // Each replica builds its result in its place in the returned value.
      typename detail::run_result<Result>::collector out(static_cast<std::size_t>(n));
      rt_.parallel([&](int r) noexcept {
        detail::guarded(rt_, errors, r, first_local_replica(), [&] {
          context_type ctx(*this, r, recorder_, timeline_.replica_track(r));
          out.take(r, detail::call_fn(rt_, fn, ctx, r, args...));
          ctx.finish_started();
        });
      });
      timeline_.drain_if_full();
      rethrow_first(errors);
      return std::move(out).finish();
    }
  }

  /// Reduces the components of `value` (a `PerReplica<T>` or `Mirrored<T>`) element-wise across
  /// replicas. `mean` divides by the number of replicas, in the element type. Every component
  /// counts: the `sum` of a `Mirrored<T>` is N times its value.
  ///
  /// **Returns**: a `T`. Combines replicas in the order 0, 1, ..., N-1, so the bits equal a serial
  /// loop's and are the same run after run.
  /// **Errors**: `mirror::shape_error` when components' leaves differ in size, or when `value`
  /// does not have one component per (local) replica.
  /// Works in cross-replica context: outside `run` (parallel over the device's threads) and inside
  /// a `merge_call` function (on the calling thread).
  ///
  /// **Device-resident leaves** (`thrust::device_vector` on `devices::Cuda`;
  /// docs/cuda.md\#device-values-on-the-host): the host never reads them. The replicas all-reduce
  /// their components on their own devices and streams through the `Ops` policy (so the combination
  /// order is the policy's), then only replica 0's stream — which already waits for every other
  /// stream's part of the collective — is synchronised, and replica 0's result is returned (a copy
  /// made by T's own copy constructor). Outside `run` only: inside `merge_call` it throws
  /// `mirror::error`.
  template <class V>
  auto reduce(ReduceOp op, const V& value, mirror::source_location where = mirror::source_location::current()) {
    static_assert(detail::is_per_replica<V>::value || detail::is_mirrored<V>::value,
                  "mirror::Strategy::reduce(op, value): value must be a PerReplica<T> or Mirrored<T> "
                  "(what run returns); inside fn, use ctx.all_reduce instead");
    using T = typename V::value_type;
    static_assert(detail::all_leaves_own<T>(),
                  "mirror::Strategy::reduce(op, value): value holds std::span (view) leaves, so the "
                  "result would alias replica 0's buffer; all_reduce the spans inside fn, or reduce "
                  "owning leaves such as std::vector");
    if (value.size() != static_cast<std::size_t>(num_local_replicas())) {
      detail::throw_component_count_error("reduce(op, value)", value.size(), num_local_replicas(), multi_worker);
    }
    const detail::at_call_site site(where);
    if constexpr (detail::has_device_leaf<T>()) {
      return reduce_on_devices(op, value, where);
    } else {
      return reduce_on_host(op, value);
    }
  }

 private:
  template <class V>
  auto reduce_on_devices(ReduceOp op, const V& value, const mirror::source_location& where) {
    using T = typename V::value_type;
    static_assert(!runtime_type::host_addressable,
                  "mirror::Strategy::reduce(op, value): value holds device-resident leaves (GPU memory) but "
                  "this strategy's device reads replicas' memory on the CPU; use devices::Cuda, or host "
                  "leaves such as std::vector");
    if (rt_.in_parallel()) {
      throw error("mirror::Strategy::reduce(op, value): value holds device-resident leaves, which the replicas "
                  "reduce on their devices; inside fn or merge_call that cannot start — use ctx.all_reduce there");
    }
    auto reduced = run([op, where](auto& ctx, const T& mine) { return ctx.all_reduce(op, mine, where); }, value);
    // Every stream's share of the all-reduce precedes the tail of replica 0's stream (the
    // collective's barriers make it wait on the others' events): that one stream is enough.
    if constexpr (requires { rt_.synchronize(0); }) rt_.synchronize(0);
    return T(reduced.primary());
  }

  template <class V>
  auto reduce_on_host(ReduceOp op, const V& value) {
    using T = typename V::value_type;
    const std::span<const T> components(value.begin(), value.size());
    T out = components[0];
    detail::reduce_components(detail::cross_op(op), components, out, host_parallel(), "reduce");
    if constexpr (multi_worker) {
      // This worker's R components are combined above; the workers' partial results are then
      // combined across processes, and a mean divides once, by W*R.
      detail::all_reduce_nest(*rt_.workers(), out, op, static_cast<std::size_t>(num_replicas_in_sync()),
                              "mirror::Strategy::reduce");
    } else if (op == ReduceOp::mean) {
      detail::divide_leaves(out, components.size());
    }
    return out;
  }

 public:
  /// Like `reduce(op, value)`, and also reduces the leading (batch) dimension of every leaf:
  /// `PerReplica<std::vector<float>>` gives `float`. `mean` divides by the total element count
  /// across all replicas, so a ragged last batch is weighted right.
  ///
  /// **Requires**: leaves of rank >= 1 (a scalar is a compile error); nests of std::tuple,
  /// std::pair or std::array. Replicas may hold different batch sizes.
  /// **Errors**: `mirror::shape_error` for the integer `mean` of zero elements (floats give NaN),
  /// or when `value` does not have one component per (local) replica.
  template <class V>
  auto reduce(ReduceOp op, const V& value, axis_t<0>, mirror::source_location where = mirror::source_location::current()) {
    static_assert(detail::is_per_replica<V>::value || detail::is_mirrored<V>::value,
                  "mirror::Strategy::reduce(op, value, axis0): value must be a PerReplica<T> or "
                  "Mirrored<T> (what run returns)");
    using T = typename V::value_type;
    // The batch-axis reduction runs on the host: device memory would be read by the CPU.
    static_assert(!detail::has_device_leaf<T>(),
                  "mirror::Strategy::reduce(op, value, axis0): value holds device-resident leaves (GPU memory), "
                  "which the host cannot read; reduce(op, value) without axis0 (it runs on the devices), then "
                  "reduce the leading dimension on the device, or return host leaves (std::vector) from fn");
    using R = detail::axis0_result_t<T>;
    if (value.size() != static_cast<std::size_t>(num_local_replicas())) {
      detail::throw_component_count_error("reduce(op, value, axis0)", value.size(), num_local_replicas(), multi_worker);
    }
    const std::span<const T> components = local_results(value);
    std::vector<const T*> ptrs;
    ptrs.reserve(components.size());
    for (const T& c : components) ptrs.push_back(&c);
    R out{};
    if constexpr (multi_worker) {
      const detail::at_call_site site(where);
      detail::reduce_axis0_across_workers<T>(*rt_.workers(), op, out, std::move(ptrs));
    } else {
      detail::reduce_axis0_into<T>(op, out, std::move(ptrs));
    }
    return out;
  }

  /// The components of a `PerReplica` or `Mirrored` value, or the copies of a variable, in
  /// replica order. Nothing is read or copied: device-resident components stay handles to
  /// device memory, ordered on their replica's stream. Read them with Thrust or `cudaMemcpy`
  /// on the legacy default stream (which waits for the replicas' blocking streams), or call
  /// `runtime().synchronize(r)` before reading replica r's memory by other means.
  template <class V>
  static auto local_results(const V& value) {
    static_assert(detail::is_per_replica<V>::value || detail::is_mirrored<V>::value || detail::is_variable<V>::value,
                  "mirror::Strategy::local_results(value): value must be a PerReplica<T>, Mirrored<T> or a variable");
    using T = typename V::value_type;
    return std::span<const T>(&*value.begin(), value.size());
  }

  /// A variable kept in sync on write: one copy of `init` per replica (see
  /// `mirror/mirrored_variable.hpp`).
  /// **Errors**: `aggregation_error` for `VariableAggregation::mean` with integer leaves.
  ///
  /// On a multi-worker device this is collective: every worker calls it in the same order, and
  /// every copy starts as the chief's `init` (TF broadcasts it, so unseeded initialisers agree).
  template <class T>
  MirroredVariable<T> make_variable(T init, VariableAggregation aggregation = VariableAggregation::none,
                                    mirror::source_location where = mirror::source_location::current()) {
    if constexpr (multi_worker) {
      const detail::at_call_site site(where);
      detail::broadcast_nest(*rt_.workers(), init, 0, "mirror::Strategy::make_variable");
    }
    return detail::access::make<MirroredVariable<T>>(init, num_local_replicas(), aggregation);
  }

  /// A variable each replica writes on its own, aggregated when read in cross-replica context
  /// (see `mirror/sync_on_read_variable.hpp`).
  ///
  /// Multi-worker: collective like `make_variable` (the chief's `init`); its cross-replica
  /// `value()` and `assign` are collective too (they combine or count every worker's copies).
  template <class T>
  SyncOnReadVariable<T> make_sync_on_read_variable(T init, VariableAggregation aggregation,
                                                   mirror::source_location where = mirror::source_location::current()) {
    detail::worker_group* g = nullptr;
    if constexpr (multi_worker) {
      const detail::at_call_site site(where);
      g = rt_.workers();
      detail::broadcast_nest(*g, init, 0, "mirror::Strategy::make_sync_on_read_variable");
    }
    return detail::access::make<SyncOnReadVariable<T>>(init, num_local_replicas(), aggregation, g);
  }

  /// Splits each global batch of `global_batches` over the replicas (views, no copy); iterate the
  /// result and pass each element to `run`. See `mirror/distributed_dataset.hpp` for the split
  /// rule and the batch types (`std::vector`, `std::span`, `mirror::matrix`, `mirror::matrix_view`
  /// leaves, and nests of them). The range is kept (owned if an rvalue, referenced otherwise).
  template <std::ranges::input_range R>
  auto distribute_dataset(R&& global_batches, InputOptions options = {}) {
    if (options.prefetch < 0) {
      throw std::invalid_argument(
          detail::format("mirror::InputOptions{.prefetch = %d}: prefetch must be >= 0", options.prefetch).c_str());
    }
    using V = detail::all_t<R>;
    detail::worker_group* g = nullptr;
    if constexpr (multi_worker) g = rt_.workers();
    return DistributedDataset<V>(detail::all(std::forward<R>(global_batches)), num_replicas_in_sync(), options,
                                 worker_index() * num_local_replicas(), num_local_replicas(), g);
  }

  /// Calls `dataset_fn(const InputContext&)` once, on this thread, with
  /// `{.num_input_pipelines = W, .input_pipeline_id = w, .num_replicas_in_sync = N}` (W = 1,
  /// w = 0 in one process); it returns a range of per-replica batches, which this worker's
  /// replicas dequeue one each per step, in replica order (shard it with `mirror::shard`).
  /// Multi-worker: each step all-reduces how many replicas got a batch, so iteration ends on
  /// every worker together, and replicas of a worker whose data ran out get empty batches.
  template <class F>
  auto distribute_datasets_from_function(F&& dataset_fn) {
    const InputContext context{num_workers(), worker_index(), num_replicas_in_sync()};
    using R = std::invoke_result_t<F&, const InputContext&>;
    static_assert(std::ranges::input_range<R>,
                  "mirror::Strategy::distribute_datasets_from_function(fn): fn(const InputContext&) must "
                  "return a range of per-replica batches");
    using V = detail::all_t<R>;
    detail::worker_group* g = nullptr;
    if constexpr (multi_worker) g = rt_.workers();
    return DatasetsFromFunction<V>(detail::all(dataset_fn(context)), num_local_replicas(), g);
  }

  /// A `Mirrored<T>` holding one copy of `value` per (local) replica. Multi-worker: collective,
  /// and every copy on every worker is the chief's `value`.
  template <class T>
  Mirrored<std::remove_cvref_t<T>> broadcast(const T& value,
                                             mirror::source_location where = mirror::source_location::current()) {
    if constexpr (multi_worker) {
      const detail::at_call_site site(where);
      std::remove_cvref_t<T> chief(value);
      detail::broadcast_nest(*rt_.workers(), chief, 0, "mirror::Strategy::broadcast");
      return detail::access::mirrored(
          detail::replica_storage<std::remove_cvref_t<T>>(static_cast<std::size_t>(num_local_replicas()), chief));
    } else {
      return detail::access::mirrored(
          detail::replica_storage<std::remove_cvref_t<T>>(static_cast<std::size_t>(num_local_replicas()), value));
    }
  }

  /// The components of `value` (a `PerReplica<T>` or `Mirrored<T>`) concatenated along the
  /// first dimension in replica order, as one value (TF's `Strategy.gather`): what
  /// `ctx.all_gather(component, axis0)` gives, in cross-replica context. Multi-worker: every
  /// worker's components, in global replica order.
  ///
  /// **Returns**: the nest with each leaf holding every replica's (ReplicaContext::all_gather's
  /// result type: a scalar or `std::array` leaf becomes a `std::vector`).
  /// **Errors**: `mirror::shape_error` when the components' matrices differ in their columns, or
  /// when `value` does not have one component per (local) replica.
  template <class V>
  auto gather(const V& value, axis_t<0>, mirror::source_location where = mirror::source_location::current()) {
    static_assert(detail::is_per_replica<V>::value || detail::is_mirrored<V>::value,
                  "mirror::Strategy::gather(value, axis0): value must be a PerReplica<T> or Mirrored<T> (what run "
                  "returns); inside fn, use ctx.all_gather instead");
    using T = typename V::value_type;
    static_assert(detail::gatherable<T>(),
                  "mirror::Strategy::gather(value, axis0): the result must hold every replica's leaves, but T has a "
                  "view leaf (std::span, matrix_view), which would alias the replicas' buffers, or is a Hana struct "
                  "with a scalar or std::array member, whose type cannot change: gather owning leaves "
                  "(std::vector, mirror::matrix), or a std::tuple");
    static_assert(!detail::has_device_leaf<T>(),
                  "mirror::Strategy::gather(value, axis0): value holds device-resident leaves (GPU memory), which the "
                  "host cannot read; all_gather them inside fn (ctx.all_gather), or return host leaves from fn");
    if (value.size() != static_cast<std::size_t>(num_local_replicas())) {
      detail::throw_component_count_error("gather(value, axis0)", value.size(), num_local_replicas(), multi_worker);
    }
    // Multi-worker: a worker whose components disagree must not throw alone (the others would
    // wait for it in the cross-worker step); every worker learns of it there and throws.
    std::string local_problem;
    auto out = detail::gather_components(local_results(value), first_local_replica(), local_problem);
    if (!multi_worker && !local_problem.empty()) throw shape_error(local_problem);
    if constexpr (multi_worker) {
      const detail::at_call_site site(where);
      detail::gather_nest_across_workers(*rt_.workers(), out, local_problem, "mirror::Strategy::gather");
    }
    return out;
  }

  /// A `PerReplica` whose component for replica r is `value_fn(ValueContext{r, N})` (TF's
  /// `experimental_distribute_values_from_function`): `value_fn` is called once per (local)
  /// replica, in replica order, on this thread. Multi-worker: the ids are global (worker w's
  /// replicas get `w*R .. w*R + R - 1`, of `N = W*R`).
  template <class F>
  auto distribute_values_from_function(F&& value_fn) {
    static_assert(std::is_invocable_v<F&, const ValueContext&>,
                  "mirror::Strategy::distribute_values_from_function(fn): fn must be callable as "
                  "fn(const mirror::ValueContext&) and return the value for that replica");
    using R = std::decay_t<std::invoke_result_t<F&, const ValueContext&>>;
    static_assert(!std::is_void_v<R>,
                  "mirror::Strategy::distribute_values_from_function(fn): fn returns void; it must return the "
                  "value for the replica its ValueContext names");
    std::vector<R> values;
    values.reserve(static_cast<std::size_t>(num_local_replicas()));
    for (int r = 0; r < num_local_replicas(); ++r) {
      values.push_back(value_fn(ValueContext{first_local_replica() + r, num_replicas_in_sync()}));
    }
    return PerReplica<R>(std::move(values));
  }

  /// The device runtime (threads, streams). Public because the device's own controls live on it:
  /// `scratch_bytes()` (docs/devices.md), `in_parallel()` (docs/tensorflow.md), and on
  /// devices::Cuda `synchronize(r)` (docs/cuda.md) and `device_of(r)`, the GPU of replica r;
  /// calling what `run` itself drives through it (cancel, exchange, barrier) is not supported.
  runtime_type& runtime() noexcept { return rt_; }
  /// The ops policy this strategy reduces with.
  const Ops& ops() const noexcept { return ops_; }

  /// Each local replica's last collectives: what, where, when, how they ended (docs/debugging.md).
  /// Read it at any time, from any thread; a timeout or mismatch raised in fn carries its table.
  const FlightRecorder& flight_recorder() const noexcept { return recorder_; }
  /// Keeps the last `n` collectives of each replica from now on, forgetting what was kept
  /// (0: only each replica's latest call, which timeouts name; the default is
  /// MIRROR_FLIGHT_RECORDER, else FlightRecorder::default_kept). Outside `run` only (inside it
  /// throws `mirror::error`); waits for a `run` on another thread to end.
  void set_flight_recorder(std::size_t n) {
    if (rt_.in_parallel()) {
      throw error("mirror::Strategy::set_flight_recorder: called inside a replica function; set it between runs");
    }
    std::lock_guard lock(run_mutex_);
    detail::recorder_writer::keep(recorder_, n);
  }

  /// Writes a timeline of this strategy's runs to `path` from now on, as a Chrome trace (JSON)
  /// that Perfetto (ui.perfetto.dev) and chrome://tracing open: a track per replica with its fn,
  /// its collectives and their phases, and on a multi-worker device one per worker with its MPI
  /// calls; worker w of several writes FILE with ".worker<w>"
  /// before a ".json" suffix (docs/debugging.md\#the-timeline). An empty path ends the file;
  /// destroying the strategy does too. The environment variable MIRROR_TIMELINE=FILE starts one
  /// at construction. Outside `run` only (inside it throws `mirror::error`).
  /// **Errors**: `backend_error` when the file cannot be written.
  void set_timeline(const std::string& path) {
    if (rt_.in_parallel()) {
      throw error("mirror::Strategy::set_timeline: called inside a replica function; set it between runs");
    }
    std::lock_guard lock(run_mutex_);
    if constexpr (multi_worker) rt_.workers()->trace_to(nullptr);
    timeline_.close();
    if (path.empty()) return;
    timeline_.open(path);
    if constexpr (multi_worker) rt_.workers()->trace_to(timeline_.comm_track());
  }

 private:
  template <class A>
  void check_components(const A& a, std::size_t index) const {
    using D = std::remove_cvref_t<A>;
    if constexpr (detail::is_per_replica<D>::value || detail::is_mirrored<D>::value || detail::is_variable<D>::value) {
      if (a.size() != static_cast<std::size_t>(num_local_replicas())) {
        throw shape_error(detail::format("mirror::Strategy::run: argument %zu has %zu components but the strategy "
                                         "has %d replicas%s; build it with one component per replica (a variable: "
                                         "make it with this strategy)",
                                         index, static_cast<std::size_t>(a.size()), num_local_replicas(),
                                         multi_worker ? " in this worker" : ""));
      }
    }
  }

  /// The worker group of a multi-worker device, else null.
  detail::worker_group* workers_or_null() noexcept {
    if constexpr (multi_worker) {
      return rt_.workers();
    } else {
      return nullptr;
    }
  }

  /// The global id of this worker's replica 0.
  int first_local_replica() const noexcept { return worker_index() * num_local_replicas(); }

  // run's error for a run called inside another (out of run: one copy, not one inlined in every
  // run call).
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_nested_run() {
    throw error("mirror::Strategy::run: called from inside a replica function or merge_call; "
                "runs do not nest — use the replica context's collectives instead");
  }
  /// Rethrows the lowest replica's error, if any, leaving `errors` empty for the next run.
  void rethrow_first(detail::replica_errors& errors) const {
    detail::rethrow_first(errors, first_local_replica(), &recorder_);
  }

  /// Runs body(arg, part, parts) over the device's threads when the work is large and we are
  /// outside a run; serially otherwise (inside merge_call the replicas are busy waiting for us).
  detail::parallel_ref host_parallel() noexcept {
    return {this, [](void* self, std::size_t bytes, void (*body)(void*, int, int), void* arg) {
              static_cast<Strategy*>(self)->host_parallel(bytes, body, arg);
            }};
  }
  void host_parallel(std::size_t bytes, void (*body)(void*, int, int), void* arg) {
    constexpr std::size_t worth_it = std::size_t{1} << 18;  // below ~256 KiB a dispatch costs more than it saves
    if (bytes < worth_it || rt_.in_parallel() || num_local_replicas() == 1) {
      body(arg, 0, 1);
      return;
    }
    std::lock_guard lock(run_mutex_);
    rt_.parallel([&](int r) noexcept { body(arg, r, num_local_replicas()); });
  }

  runtime_type rt_;
  Ops ops_;
  detail::replica_errors errors_;  // one per replica, for run (guarded by run_mutex_)
  // Each replica's last collectives (timeouts name where each replica is from it).
  FlightRecorder recorder_{rt_.num_replicas(), first_local_replica(), detail::kept_from_environment()};
  // The timeline's tracks and file (off unless set_timeline or MIRROR_TIMELINE).
  detail::timeline timeline_{rt_.num_replicas(), worker_index(), num_workers()};
  std::mutex run_mutex_;
};

}  // namespace mirror
