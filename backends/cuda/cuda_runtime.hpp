// SPDX-License-Identifier: Apache-2.0
#pragma once
// The runtime of devices::Cuda (models mirror::device_runtime, mirror/concepts/device.hpp).
//
// Control plane: the threads backend's pool, one host thread per replica, with that replica's
// device current while fn runs. Memory plane: device memory through cudaMalloc, one stream per
// replica; copies, combines and divides are enqueued on the calling replica's stream. Each
// replica also has a communication stream for NCCL (fork_to_comm, mark_comm, join_comm below),
// so that a started collective runs beside the kernels fn enqueues after it.
// Ordering across streams rides on the control plane: at every exchange and barrier each
// replica records an event on its stream before it arrives and, once all have arrived, makes
// its stream wait for every other replica's event. So work enqueued before a barrier on any
// stream precedes work enqueued after it on every stream, and the host never blocks on the GPU
// (except to hand a host leaf back, detach).
//
// Everything that calls CUDA lives in cuda_runtime.cpp (libmirror_cuda); this header declares
// it, so g++ compiles it without CUDA headers. Every CUDA failure is a mirror::backend_error
// carrying the cudaError_t and its text.

#include <atomic>
#include <concepts>
#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include <mirror/backends/cuda/device_ptr.hpp>
#include <mirror/backends/cuda/device_span.hpp>
#include <mirror/backends/cuda/element_type.hpp>
#include <mirror/backends/cuda/kernels.hpp>  // max_fold_parts (no CUDA header)
#include <mirror/backends/threads/threads_runtime.hpp>
#include <mirror/backend/exchanged.hpp>
#include <mirror/detail/owned.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::cuda {

/// Number of CUDA devices this process can use; 0 when there is none, no driver, or the
/// driver is too old (never throws: this is the question a fallback asks).
int device_count() noexcept;

/// The PCI bus id of CUDA device `device` ("0000:41:00.0"): the same GPU has the same id in
/// every process of a host, whatever its ordinal there (CUDA_VISIBLE_DEVICES renumbers).
/// Throws `mirror::backend_error`.
std::string pci_bus_id(int device);

/// Inside `fn` on `devices::Cuda`: the calling replica's stream (a `cudaStream_t` as `void*`).
/// Kernels and copies enqueued there are ordered with the replica's collectives. Null on a
/// thread that is not running a replica.
void* current_stream() noexcept;

namespace impl {

struct state;  // streams, events, buffers, peer map: defined in cuda_runtime.cpp
void destroy(state*) noexcept;  // what detail::owned<state> calls

/// Where a buffer lives: an address and its device ordinal.
struct located {
  void* ptr;
  int device;
};

// All of these throw mirror::backend_error (or std::invalid_argument for a bad setting).
state* create_state(std::span<const int> gpus, int replicas_per_gpu);  // owned by a detail::owned<state>
int num_replicas(const state&) noexcept;
int device_of(const state&, int replica) noexcept;
int replicas_per_gpu(const state&) noexcept;
std::span<const int> gpus(const state&) noexcept;
void* stream_of(const state&, int replica) noexcept;  // a cudaStream_t
void* comm_stream_of(const state&, int replica) noexcept;  // a cudaStream_t
bool bind(state&, int replica) noexcept;               // make replica's device current; false on failure
void unbind() noexcept;                                // current_stream() is null again
int current_device() noexcept;                         // the thread's current device; -1 if unknown
void restore_device(int device) noexcept;              // makes it current again (no-op for -1)
[[noreturn]] void throw_bind_error(state&);
void begin_parallel(state&) noexcept;
void before_arrival(state&, int self);
void after_arrival(state&, int self);
located attach(state&, int self, void* host, std::size_t bytes);
void detach(state&, int self, located dev, void* host, std::size_t bytes, bool copy_back);
located scratch(state&, int self, std::size_t bytes);
located stage_argument(state&, int self, std::size_t slot, const void* host, std::size_t bytes);
void copy(state&, int self, located dst, located src, std::size_t bytes, bool on_comm = false);
located comm_scratch(state&, int self, std::size_t bytes);
void fork_to_comm(state&, int self);
void* mark_comm(state&, int self);  // a cudaEvent_t recorded on the communication stream
void join_comm(state&, int self, void* mark);
void combine(state&, int self, ReduceOp op, detail::element_kind type, located dst, located src, std::size_t n,
             std::size_t element_bytes);
void divide(state&, int self, detail::element_kind type, located p, std::size_t n, std::size_t count,
            std::size_t element_bytes);
bool fold_into_all(state&, int self, ReduceOp op, detail::element_kind type, const located* parts, int count,
                   std::size_t n);
void synchronize(state&, int replica);

}  // namespace impl

/// The runtime of `devices::Cuda`: owns the streams, events and buffers of every replica.
class runtime {
 public:
  /// A handle to a replica's device memory: the pointer and its device.
  template <class E>
  using pointer = device_ptr<E>;
  /// Device memory is not readable by the replicas' host threads.
  static constexpr bool host_addressable = false;
  /// Largest payload `exchange` carries (the host threads' exchange does it).
  static constexpr std::size_t max_exchange_bytes = threads::runtime::max_exchange_bytes;

  /// `gpus` empty: every visible GPU. Throws `mirror::backend_error` when CUDA has no device.
  runtime(std::span<const int> gpus, int replicas_per_gpu, std::chrono::milliseconds timeout)
      : state_{impl::create_state(gpus, replicas_per_gpu)}, host_(impl::num_replicas(*state_), timeout),
        timeout_(timeout) {}

  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  ~runtime() = default;

  /// The replica count (GPUs x replicas per GPU).
  int num_replicas() const noexcept { return host_.num_replicas(); }
  /// True on a thread that is running a replica function of this runtime.
  bool in_parallel() const noexcept { return host_.in_parallel(); }

  /// Calls f(r) on every replica's thread with replica r's device current.
  template <class F>
  void parallel(F&& f) {
    static_assert(std::is_nothrow_invocable_v<F&, int>, "runtime::parallel(f): f(int) must be noexcept");
    impl::begin_parallel(*state_);
    // The calling thread runs replica 0: afterwards it has its own device back, and no stream.
    const int caller_device = impl::current_device();
    std::atomic<bool> failed{false};
    host_.parallel([&](int r) noexcept {
      // A replica whose device cannot be made current runs nothing; the others' collectives are
      // cancelled, and the CUDA error is thrown once all have returned.
      if (!impl::bind(*state_, r)) {
        failed.store(true);
        host_.cancel();
        return;
      }
      f(r);
      impl::unbind();
    });
    impl::restore_device(caller_device);
    if (failed.load()) impl::throw_bind_error(*state_);
  }

  /// Makes every waiting and later exchange/barrier of the current parallel call throw.
  void cancel() { host_.cancel(); }
  /// Cancels with `error` as every replica's (threads::runtime::fail_collective).
  void fail_collective(std::exception_ptr error) noexcept { host_.fail_collective(std::move(error)); }

  /// All-gather of `payload` among the replicas' host threads, and a barrier; NCCL's pending
  /// work of `self` is checked first (its completion ring), so a stuck GPU is named.
  template <class P>
  mirror::backend::exchanged<P> exchange(int self, const P& payload) {
    impl::before_arrival(*state_, self);
    auto all = host_.exchange(self, payload);
    impl::after_arrival(*state_, self);
    return all;
  }

  /// Waits until every replica has arrived (checking `self`'s pending NCCL work first).
  void barrier(int self) {
    impl::before_arrival(*state_, self);
    host_.barrier(self);
    impl::after_arrival(*state_, self);
  }

  // ---- memory plane ----
  // (impl::located{...} is spelled out in the calls below: nvcc 13 mistranslates a bare braced
  // argument there into host code that g++ rejects, which broke .cu files including mirror.)

  /// A leaf in device memory is used in place; a host leaf is copied to a staging buffer on
  /// `self`'s device (and copied back by `detach`).
  template <class E>
  pointer<E> attach(int self, std::span<E> leaf) {
    const auto l = impl::attach(*state_, self, const_cast<std::remove_const_t<E>*>(leaf.data()), leaf.size_bytes());
    return {static_cast<E*>(l.ptr), l.device};
  }
  /// Copies a staged host leaf back from `self`'s device (nothing for a device leaf); a
  /// read-only (`const E`) staged leaf is released without a copy.
  template <class E>
  void detach(int self, pointer<E> p, std::span<E> leaf) {
    using T = std::remove_const_t<E>;
    impl::detach(*state_, self, impl::located{const_cast<T*>(p.ptr), p.device}, const_cast<T*>(leaf.data()),
                 leaf.size_bytes(), !std::is_const_v<E>);
  }
  /// `self`'s scratch space on its device for `n` elements, grown when needed.
  template <class E>
  pointer<E> scratch(int self, std::size_t n) {
    const auto l = impl::scratch(*state_, self, n * sizeof(E));
    return {static_cast<E*>(l.ptr), l.device};
  }
  /// run's copy of a shared host argument (docs/cuda.md\#host-arguments-of-run): fn receives this
  /// view of `self`'s copy. The copy is enqueued on `self`'s stream before fn starts, into a buffer
  /// per slot that later runs reuse (same stream, so a run's upload waits for the kernels of the
  /// previous run that read the buffer). The copy is waited for (with the replica's earlier
  /// work on its stream), so the host data may change as soon as run returns. A span over
  /// managed memory, or over device memory the replica's GPU can address, is viewed in place;
  /// another GPU's memory without peer access is copied over. The view is valid while fn runs:
  /// the next run reuses (or, to grow it, frees) the buffer.
  template <class E>
  using view = device_span<E>;
  /// See `view`: the copy of `host` for argument slot `slot` on `self`'s device.
  template <class E>
  view<const E> stage_argument(int self, std::size_t slot, std::span<const E> host) {
    const auto l = impl::stage_argument(*state_, self, slot, host.data(), host.size_bytes());
    return {static_cast<const E*>(l.ptr), host.size()};
  }

  ///@{
  /// The copy, combine and divide primitives of the `device` concept, enqueued on `self`'s
  /// stream: a peer copy (or one staged through host memory) when `src` is on another GPU, and
  /// the element kernels of backends/cuda/kernels.cu for combine and divide.
  /// (`src` may be read-only: a `pointer<const E>` of an attached input.)
  template <class E, class S>
    requires std::same_as<const E, const S>
  void copy(int self, pointer<E> dst, pointer<S> src, std::size_t n) {
    copy_on(self, dst, src, n, false);
  }
  template <class E, class S>
    requires std::same_as<const E, const S>
  void combine(int self, ReduceOp op, pointer<E> dst, pointer<S> src, std::size_t n) {
    impl::combine(*state_, self, op, kernel_kind_of<E>(), impl::located{dst.ptr, dst.device},
                  impl::located{const_cast<E*>(src.ptr), src.device}, n, sizeof(E));
  }
  template <class E>
  void divide(int self, pointer<E> p, std::size_t n, std::size_t count) {
    impl::divide(*state_, self, kernel_kind_of<E>(), impl::located{p.ptr, p.device}, n, count, sizeof(E));
  }
  ///@}

  /// The most parts `fold_into_all` takes.
  static constexpr int max_fold_parts = impl::max_fold_parts;
  /// An optional primitive of the `device` concept, which policies use where a device has it:
  /// folds `n` elements of `count` parts (`parts[0] op parts[1] op ...`, in that order, divided
  /// by `count` for mean) and writes the result into every part, in one kernel on `self`'s
  /// stream that reads and writes each part once (copy, combine and divide would move the
  /// bytes 2 to 3 times as often). The bits are those of copy, combine in part order, and
  /// divide. Returns false, having done nothing, when a part is on a GPU that `self`'s cannot
  /// reach (no peer access) or `count` exceeds `max_fold_parts`: the caller then composes the
  /// other primitives.
  template <class E>
  bool fold_into_all(int self, ReduceOp op, const pointer<E>* parts, int count, std::size_t n) {
    if (count < 1 || count > max_fold_parts) return false;
    impl::located l[impl::max_fold_parts];
    for (int r = 0; r < count; ++r) l[r] = impl::located{parts[r].ptr, parts[r].device};
    return impl::fold_into_all(*state_, self, op, kernel_kind_of<E>(), l, count, n);
  }

  // ---- for backends (NCCL), tests and benchmarks ----

  /// Replica r's CUDA device ordinal.
  int device_of(int replica) const noexcept { return impl::device_of(*state_, replica); }
  /// Replica r's stream, as a `cudaStream_t` cast to `void*`.
  void* stream_of(int replica) const noexcept { return impl::stream_of(*state_, replica); }

  /// \name The communication stream (docs/cuda.md\#the-communication-stream)
  /// Each replica has a second stream on its GPU where NCCL's work goes, so that kernels `fn`
  /// enqueues after starting a collective run beside it. The two are ordered by events only:
  /// `fork_to_comm` before the collective's first piece of work, `mark_comm` after its last,
  /// `join_comm` where the replica's stream must see the result.
  ///@{
  /// Replica r's communication stream, as a `cudaStream_t` cast to `void*`.
  void* comm_stream_of(int replica) const noexcept { return impl::comm_stream_of(*state_, replica); }
  /// Makes `self`'s communication stream wait for everything enqueued so far on its stream.
  void fork_to_comm(int self) { impl::fork_to_comm(*state_, self); }
  /// An event recorded on `self`'s communication stream after everything enqueued there so far;
  /// `join_comm` takes it back. Never blocks the host.
  void* mark_comm(int self) { return impl::mark_comm(*state_, self); }
  /// Makes `self`'s stream wait for `mark` (from `mark_comm`), whose event is then reused.
  void join_comm(int self, void* mark) { impl::join_comm(*state_, self, mark); }
  /// `self`'s scratch space for `n` elements, used on its communication stream only (growing it
  /// waits for that stream alone).
  template <class E>
  pointer<E> comm_scratch(int self, std::size_t n) {
    const auto l = impl::comm_scratch(*state_, self, n * sizeof(E));
    return {static_cast<E*>(l.ptr), l.device};
  }
  /// `copy`, enqueued on `self`'s communication stream.
  template <class E, class S>
    requires std::same_as<const E, const S>
  void comm_copy(int self, pointer<E> dst, pointer<S> src, std::size_t n) {
    copy_on(self, dst, src, n, true);
  }
  ///@}
  /// Logical devices per GPU (`devices::Cuda::replicas_per_gpu`).
  int replicas_per_gpu() const noexcept { return impl::replicas_per_gpu(*state_); }
  /// The GPU ordinals in use, one per physical device, in replica order.
  std::span<const int> gpus() const noexcept { return impl::gpus(*state_); }
  /// The collective timeout of the device policy.
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Blocks until replica r's streams (its own and its communication stream) have finished their work.
  void synchronize(int replica) { impl::synchronize(*state_, replica); }

  /// State a cross-device ops policy keeps for the lifetime of this runtime (NCCL keeps its
  /// communicators here: created once per device set, reused by every collective).
  template <class T, class Make>
  T& extension(Make&& make) {
    if (extension_.p == nullptr) {
      extension_.p = make();
      extension_.destroy = [](void* p) { delete static_cast<T*>(p); };
    }
    return *static_cast<T*>(extension_.p);
  }

 private:
  // copy and comm_copy: nothing for an empty or self copy, else the copy on the chosen stream.
  template <class E, class S>
  void copy_on(int self, pointer<E> dst, pointer<S> src, std::size_t n, bool on_comm) {
    if (n == 0 || (static_cast<const E*>(dst.ptr) == src.ptr && dst.device == src.device)) return;
    impl::copy(*state_, self, impl::located{dst.ptr, dst.device}, impl::located{const_cast<E*>(src.ptr), src.device},
               n * sizeof(E), on_comm);
  }
  // The extension's owner written out rather than std::unique_ptr: this class is compiled by every
  // translation unit of a CUDA build (<mirror/mirror.hpp> brings it; docs/design.md#compile-time).
  struct owned_extension {
    void* p = nullptr;
    void (*destroy)(void*) = nullptr;
    owned_extension() = default;
    owned_extension(const owned_extension&) = delete;
    owned_extension& operator=(const owned_extension&) = delete;
    ~owned_extension() {
      if (destroy != nullptr) destroy(p);
    }
  };
  detail::owned<impl::state> state_;  // first: the pool's threads must stop before the streams go
  threads::runtime host_;
  std::chrono::milliseconds timeout_;
  // Destroyed first (declared last): communicators go before the streams they use.
  owned_extension extension_;
};

}  // namespace mirror::cuda
