// SPDX-License-Identifier: Apache-2.0
// mirror::mpi::group: cross-worker collectives over MPI. Each job is a non-blocking MPI
// collective posted in program order and polled with MPI_Test while the control communicator is
// served (who-has-arrived queries, failure notices), so that a timeout can name the workers that
// did not arrive and a failure on one worker reaches the others at once. The caller of a blocking
// collective runs its job itself when the group's communication thread is idle; started jobs,
// and jobs behind them, are handed to that thread, which also serves the control communicator
// while no job runs. This file holds the group's construction and its public collectives;
// group/impl.hpp lists the others.

#include <mirror/backends/mpi/group/impl.hpp>
#include <mirror/backends/mpi/survivors.hpp>

#include <exception>

namespace mirror::mpi {
namespace {

std::once_flag finalize_registered;
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

/// This worker's share of its host's cores: each CPU in its affinity mask counts 1/k, k = the
/// workers on this host whose masks hold it (2 unbound workers on 2 cores: 1 each; bound to a
/// core each: 1 each; 3 unbound on 2 cores: 2/3 each). Collective over `comm`.
double share_of_host_cores(MPI_Comm comm) {
  MPI_Comm host = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), "MPI_Comm_split_type");
  int size = 1;
  MPI_Comm_size(host, &size);
  double share = 0;
#if defined(__linux__)
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
    for (int c = 0; c < static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) && c < CPU_SETSIZE; ++c) {
      CPU_SET(c, &mine);
    }
  }
  std::vector<cpu_set_t> all(static_cast<std::size_t>(size));
  const int code = MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, host);
  MPI_Comm_free(&host);
  check(code, "MPI_Allgather (affinity masks)");
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &mine)) continue;
    int k = 0;
    for (const cpu_set_t& m : all) k += CPU_ISSET(c, &m) ? 1 : 0;
    share += 1.0 / std::max(k, 1);
  }
#else
  MPI_Comm_free(&host);
  share = static_cast<double>(std::max(1u, std::thread::hardware_concurrency())) / size;
#endif
  return share;
}

}  // namespace

namespace support {

void initialize_mpi() {
  int initialised = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw std::invalid_argument("mirror::devices::Cluster: MPI was already finalized; build the strategy before "
                                "MPI_Finalize");
  }
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::call_once(finalize_registered, [] { std::atexit(finalize_at_exit); });
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    throw std::invalid_argument(
        detail::format(
            "mirror::devices::Cluster: MPI was initialised with thread level %d, below MPI_THREAD_SERIALIZED; mirror "
            "makes its MPI calls on its communication thread or the calling thread (never two at once), which needs "
            "at least MPI_THREAD_SERIALIZED. Initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) (needed anyway "
            "if your code calls MPI while a strategy exists), or let mirror initialise it",
            provided)
            .c_str());
  }
}

void wait_for_everyone(MPI_Request& request, clock::time_point deadline, std::chrono::milliseconds timeout,
                       MPI_Comm comm, const char* call) {
  for (int done = 0;;) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    if (clock::now() >= deadline) {
      int size = 0, rank = 0;
      MPI_Comm_size(comm, &size);
      MPI_Comm_rank(comm, &rank);
      throw timeout_error(detail::format("mirror::devices::Cluster: not every worker of the communicator built its "
                                         "strategy within %lld ms (worker %d of %d waited in %s); every worker must "
                                         "construct it, in the same order",
                                         static_cast<long long>(timeout.count()), rank, size, call),
                          {});
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace support

// A function-try-block: a worker that dies while the others build their strategy fails their
// duplications and checks, which is a loss, as later (elastic::train builds the next strategy on
// the survivors).
group::group(const group_options& o) try : impl_(new impl()) {
  impl& m = *impl_;
  if (o.timeout.count() <= 0) {
    throw std::invalid_argument(detail::format("mirror::devices::Cluster{.timeout = %lld ms}: the cross-worker timeout "
                                               "must be positive",
                                               static_cast<long long>(o.timeout.count()))
                                    .c_str());
  }
  m.timeout = o.timeout;
  m.validate = o.validate_shapes;
  m.R = o.local_replicas;
  if (const char* direct = std::getenv("MIRROR_MPI_DIRECT_AGREEMENT"); direct != nullptr && *direct != '\0') {
    char* end = nullptr;
    const long n = std::strtol(direct, &end, 10);
    if (*end != '\0' || n < 1 || n > impl::direct_agreement_max) {
      throw std::invalid_argument(detail::format("mirror::devices::Cluster: MIRROR_MPI_DIRECT_AGREEMENT=%s: expected the "
                                                 "most workers whose agreement check is direct messages, 1 to %d",
                                                 direct, impl::direct_agreement_max)
                                      .c_str());
    }
    m.direct_agreement = static_cast<int>(n);
  }
  initialize_mpi();
  m.fault_tolerant = fault_tolerant();
  make_ops();
  make_agreement_ops();
  static_assert(sizeof(MPI_Comm) <= sizeof(std::uint64_t));
  const MPI_Comm comm = o.comm.is_world() ? MPI_COMM_WORLD : o.comm.get<MPI_Comm>();
  const errors_returned on_comm{comm, m.fault_tolerant};  // a death here is a loss, not the job's end
  // Every collective of the construction is non-blocking and waited with the timeout: a worker
  // that never builds its strategy must not hang the others, not even in the duplications.
  const auto deadline = clock::now() + m.timeout;
  const auto wait_for_everyone = [&](MPI_Request& request, const char* call) {
    support::wait_for_everyone(request, deadline, m.timeout, comm, call);
  };
  {
    // On the heap, and kept if the wait gives up: MPI writes the handle when the duplication
    // completes, whenever that is (keep_until_exit says why).
    auto handles = std::make_unique<MPI_Comm[]>(2);
    handles[0] = handles[1] = MPI_COMM_NULL;
    try {
      for (int k = 0; k < 2; ++k) {
        const char* call = k == 0 ? "MPI_Comm_idup (data)" : "MPI_Comm_idup (control)";
        MPI_Request request = MPI_REQUEST_NULL;
        check(MPI_Comm_idup(comm, &handles[static_cast<std::size_t>(k)], &request), call);
        wait_for_everyone(request, call);
      }
    } catch (...) {
      keep_until_exit(handles);
      throw;
    }
    m.data = handles[0];
    m.control = handles[1];
  }
  MPI_Comm_set_errhandler(m.data, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(m.control, MPI_ERRORS_RETURN);
  MPI_Comm_size(m.data, &m.W);
  MPI_Comm_rank(m.data, &m.w);
  m.known.assign(static_cast<std::size_t>(m.W), -1);
  m.left.assign(static_cast<std::size_t>(m.W), 0);

  // Equal R everywhere (TF leaves it undefined): {R, -R} under MAX, then the names.
  // Non-blocking with the timeout: a worker that never builds its strategy must not hang the
  // others here either.
  // The same message settles whether every worker can select libnbc's ring (ring_algorithm):
  // a worker where the MPI_T variable is fixed (an --mca setting, a host's own
  // mca-params.conf) would otherwise post another schedule than its peers.
  m.ring_algorithm.open();
  // So does the limit of direct agreement checks (impl::direct_agreement), which every worker
  // must share for its checks to match.
  // On the heap, and kept if the check times out (keep_until_exit says why).
  auto both = std::make_unique<int[]>(5);
  both[0] = m.R;
  both[1] = -m.R;
  both[2] = m.ring_algorithm.usable ? 0 : 1;
  both[3] = m.direct_agreement;
  both[4] = -m.direct_agreement;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, both.get(), 5, MPI_INT, MPI_MAX, m.data, &request),
        "MPI_Iallreduce (replica count check)");
  try {
    wait_for_everyone(request, "MPI_Iallreduce (replica count check)");
  } catch (...) {
    m.ring_algorithm.close();
    keep_until_exit(both);  // the request is still posted
    throw;
  }
  // A setting that differs between workers: every worker throws, after freeing what it made.
  const auto refuse = [&m](const detail::message& why) {
    m.ring_algorithm.close();
    MPI_Comm_free(&m.data);
    MPI_Comm_free(&m.control);
    throw std::invalid_argument(why.c_str());
  };
  if (both[0] != -both[1]) {
    std::vector<int> all(static_cast<std::size_t>(m.W));
    check(MPI_Allgather(&m.R, 1, MPI_INT, all.data(), 1, MPI_INT, m.data), "MPI_Allgather (replica count check)");
    std::string text;
    for (int p = 0; p < m.W; ++p) {
      text += detail::format("%sworker %d has %d", p == 0 ? "" : ", ", p, all[static_cast<std::size_t>(p)]).c_str();
    }
    refuse(detail::format("mirror::devices::Cluster: the workers have different numbers of local replicas (%s); every "
                          "worker must use the same local device settings (TF: \"every worker to have the same number "
                          "of replicas\")",
                          text.c_str()));
  }
  if (both[3] != -both[4]) {
    refuse(detail::format("mirror::devices::Cluster: MIRROR_MPI_DIRECT_AGREEMENT differs between the workers (from %d "
                          "to %d; here %d); set it alike on every worker, or on none",
                          -both[4], both[3], m.direct_agreement));
  }
  // Every worker is here (the check above completed): the blocking calls cannot hang.
  const double share = share_of_host_cores(m.data);
  m.cores = std::max(1u, static_cast<unsigned>(share + 1e-9));
  m.oversubscribed = share < 1 - 1e-9;
  // MPI_Finalize deletes MPI_COMM_SELF's attributes first: that stops the thread in time.
  check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &impl::on_finalize, &m.keyval, nullptr), "MPI_Comm_create_keyval");
  check(MPI_Comm_set_attr(MPI_COMM_SELF, m.keyval, &m), "MPI_Comm_set_attr");
  if (both[2] != 0) m.ring_algorithm.usable = false;  // some worker cannot: none does
  m.thread = std::thread([&m] { m.main_loop(); });
} catch (const backend_error& e) {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down && fault_tolerant()) support::throw_if_lost(o.comm, o.local_replicas, e);
  // (the handler of a constructor's function-try-block rethrows e at its end)
}

group::~group() {
  impl& m = *impl_;
  {
    std::lock_guard lock(m.listener_mutex);
    if (m.device_listener != nullptr) m.device_listener->group_gone();
    m.device_listener = nullptr;
  }
  m.shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_delete_attr(MPI_COMM_SELF, m.keyval);  // its callback finds the group already shut down
    MPI_Comm_free_keyval(&m.keyval);
  }
}

int group::num_workers() const noexcept { return impl_->W; }
int group::worker_index() const noexcept { return impl_->w; }
int group::local_replicas() const noexcept { return impl_->R; }
void group::reduce_in_worker_order(bool on) noexcept { impl_->worker_order = on; }
unsigned group::host_cores() const noexcept { return impl_->cores; }

void group::check_all_reduce(std::size_t count, detail::element_kind kind, ReduceOp op, const char* what) {
  if (!impl_->validate) return;  // Cluster{.validate_shapes = false}: trust the program
  impl::job j{impl::job::check, nullptr, count, kind, op, 0, what, false, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  impl_->run(j);
}

namespace {
// MPI counts are ints. `collective` names it in the message.
void require_int_count(std::size_t count, const char* what, const char* collective = "all-reduce") {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(
        detail::format("%s: %zu elements in one cross-worker %s exceed MPI's int count; split the leaf", what, count,
                       collective)
            .c_str());
  }
}

// The elements of several leaves (their sum), within MPI's int count.
std::size_t leaves_total(const std::size_t* counts, std::size_t num_leaves, const char* what,
                         const char* collective = "all-reduce") {
  std::size_t total = 0;
  for (std::size_t k = 0; k < num_leaves; ++k) total += counts[k];
  require_int_count(total, what, collective);
  return total;
}
}  // namespace

void group::all_reduce(void* data, std::size_t count, detail::element_kind kind, ReduceOp op, const char* what,
                       bool checked) {
  require_int_count(count, what);
  impl::job j{impl::job::reduce, data, count, kind, op, 0, what, checked, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  impl_->run(j);
}

std::unique_ptr<detail::worker_group::started_collective> group::start_all_reduce(
    void* data, std::size_t count, detail::element_kind kind, ReduceOp op, const char* what, bool checked) {
  require_int_count(count, what);
  auto s = std::make_unique<impl::started>(*impl_, impl::job::reduce, data, count, kind, op, what, checked);
  return impl_->post_started(std::move(s));
}

void group::all_reduce_leaves(void* const* leaves, const std::size_t* counts, std::size_t num_leaves,
                              detail::element_kind kind, ReduceOp op, const char* what, bool checked) {
  impl::job j{impl::job::reduce, nullptr, leaves_total(counts, num_leaves, what), kind, op, 0, what, checked, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  j.leaves = leaves;
  j.leaf_counts = counts;
  j.num_leaves = num_leaves;
  impl_->run(j);
}

std::unique_ptr<detail::worker_group::started_collective> group::start_all_reduce_leaves(
    void* const* leaves, const std::size_t* counts, std::size_t num_leaves, detail::element_kind kind, ReduceOp op,
    const char* what, bool checked) {
  auto s = std::make_unique<impl::started>(*impl_, impl::job::reduce, nullptr, leaves_total(counts, num_leaves, what),
                                           kind, op, what, checked);
  s->leaves.assign(leaves, leaves + num_leaves);
  s->sizes.assign(counts, counts + num_leaves);
  s->j.leaves = s->leaves.data();
  s->j.leaf_counts = s->sizes.data();
  s->j.num_leaves = num_leaves;
  return impl_->post_started(std::move(s));
}

void group::check_broadcast(const std::size_t* shape, std::size_t num_leaves, int root, const char* what,
                            std::uint64_t nest_hash) {
  if (!impl_->validate) return;
  impl::job j{impl::job::check, nullptr, 0, {}, ReduceOp::sum, root, what, false, nullptr};
  j.checks_broadcast = true;
  j.nest_hash = nest_hash;
  j.sizes = shape;
  j.num_sizes = num_leaves;
  impl_->run(j);
}

void group::broadcast(void* data, std::size_t bytes, int root, const char* what) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(
        detail::format("%s: %zu bytes in one cross-worker broadcast exceed MPI's int count; split the leaf", what, bytes)
            .c_str());
  }
  impl::job j{impl::job::bcast, data, bytes, {}, ReduceOp::sum, root, what, false, nullptr};
  impl_->run(j);
}

namespace {
// A reduce-scatter's elements (the leaves' sum), within MPI's int count.
std::size_t scatter_total(const std::size_t* leaf_sizes, std::size_t num_leaves, const char* what) {
  return leaves_total(leaf_sizes, num_leaves, what, "reduce-scatter");
}
}  // namespace

void group::reduce_scatter(const void* in, const std::size_t* leaf_sizes, std::size_t num_leaves, void* out,
                           detail::element_kind kind, ReduceOp op, const char* what) {
  impl::job j{impl::job::scatter, const_cast<void*>(in), scatter_total(leaf_sizes, num_leaves, what), kind, op, 0,
              what, false, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  j.sizes = leaf_sizes;
  j.num_sizes = num_leaves;
  j.out = out;
  impl_->run(j);
}

std::unique_ptr<detail::worker_group::started_collective> group::start_reduce_scatter(
    const void* in, const std::size_t* leaf_sizes, std::size_t num_leaves, void* out, detail::element_kind kind,
    ReduceOp op, const char* what) {
  auto s = std::make_unique<impl::started>(*impl_, impl::job::scatter, const_cast<void*>(in),
                                           scatter_total(leaf_sizes, num_leaves, what), kind, op, what, false);
  s->sizes.assign(leaf_sizes, leaf_sizes + num_leaves);
  s->j.sizes = s->sizes.data();
  s->j.num_sizes = num_leaves;
  s->j.out = out;
  return impl_->post_started(std::move(s));
}

void group::reduce_scatter_leaves(const void* const* in, const std::size_t* leaf_sizes, std::size_t num_leaves,
                                  void* const* out, detail::element_kind kind, ReduceOp op, const char* what) {
  impl::job j{impl::job::scatter, nullptr, scatter_total(leaf_sizes, num_leaves, what), kind, op, 0, what, false,
              nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  j.sizes = j.leaf_counts = leaf_sizes;
  j.num_sizes = j.num_leaves = num_leaves;
  j.leaves = const_cast<void* const*>(in);  // read only (job::leaves)
  j.out_leaves = out;
  impl_->run(j);
}

std::unique_ptr<detail::worker_group::started_collective> group::start_reduce_scatter_leaves(
    const void* const* in, const std::size_t* leaf_sizes, std::size_t num_leaves, void* const* out,
    detail::element_kind kind, ReduceOp op, const char* what) {
  auto s = std::make_unique<impl::started>(*impl_, impl::job::scatter, nullptr,
                                           scatter_total(leaf_sizes, num_leaves, what), kind, op, what, false);
  s->sizes.assign(leaf_sizes, leaf_sizes + num_leaves);
  for (std::size_t k = 0; k < num_leaves; ++k) s->leaves.push_back(const_cast<void*>(in[k]));  // read only
  s->out_leaves.assign(out, out + num_leaves);
  s->j.sizes = s->j.leaf_counts = s->sizes.data();
  s->j.num_sizes = s->j.num_leaves = num_leaves;
  s->j.leaves = s->leaves.data();
  s->j.out_leaves = s->out_leaves.data();
  return impl_->post_started(std::move(s));
}

void group::all_gather(void* const* leaves, std::size_t num_leaves, const std::size_t* counts,
                       std::size_t element_bytes, const char* what, bool checked, const void* const* own) {
  if (checked && num_leaves == 1 && impl_->take_carried_blocks(leaves[0], counts, element_bytes, own)) return;
  std::size_t total = 0;
  for (std::size_t i = 0; i < num_leaves * static_cast<std::size_t>(impl_->W); ++i) total += counts[i];
  const detail::element_kind kind{detail::element_kind::category::unsigned_integer,
                                  static_cast<std::uint8_t>(element_bytes)};
  impl::job j{impl::job::gather, nullptr, total * element_bytes, kind, ReduceOp::sum, 0, what, checked, nullptr};
  j.sizes = counts;
  j.num_sizes = num_leaves;
  j.leaves = leaves;
  j.own = own;
  impl_->run(j);
}

void group::all_gather_counts(const std::size_t* mine, std::size_t per_worker, std::size_t* all, const char* what,
                              const void* block, std::size_t block_bytes) {
  impl::job j{impl::job::counts, const_cast<std::size_t*>(mine), per_worker, int64_kind, ReduceOp::sum, 0, what, false,
              nullptr};
  j.out = all;
  j.block = block;
  j.block_bytes = block_bytes;
  impl_->run(j);
}

void group::next_phase() noexcept { impl_->phase.fetch_add(1, std::memory_order_relaxed); }

void group::trace_to(detail::trace_track* track) noexcept {
  // Under the mutex the communication thread takes each job under: it sees the change at its next.
  std::lock_guard lock(impl_->mutex);
  impl_->trace = track;
}

void group::report_failure(int global_replica, const std::exception_ptr& failure) noexcept {
  impl& m = *impl_;
  try {
    std::lock_guard lock(m.mutex);
    if (m.broken.why != impl::broken_state::none) return;  // already known to be over (and told)
    // An error every worker raised together is not forwarded, nor one that a layer above
    // threw again with its own context, nesting it (a gradient bucket names its leaves).
    std::exception_ptr nested;
    try {
      std::rethrow_exception(failure);
    } catch (const std::nested_exception& n) {
      nested = n.nested_ptr();
    } catch (...) {
    }
    for (const auto& e : m.symmetric) {
      if (e == failure || (nested != nullptr && e == nested)) return;  // the group is still usable
    }
    const std::int64_t now = m.phase.load(std::memory_order_relaxed);
    if (m.failure.phase == now) return;  // this run has failed already (here or elsewhere): all are told
    // Every worker refuses every call of this run already (a disagreement): nothing to drain,
    // and a recovery would count the disagreement's own exchanges in different phases.
    if (now <= m.refused_through) return;
    impl::failure_info f{now, global_replica, what_of(failure), impl::failed_in_fn, {}};
    try {
      std::rethrow_exception(failure);
    } catch (const shape_error&) {
      f.kind = impl::failed_shape;  // a mismatch among this worker's replicas
    } catch (const timeout_error& e) {
      f.kind = impl::failed_timeout;  // a replica of this worker did not reach a collective
      f.missing = e.missing();
    } catch (...) {
    }
    m.failure = std::move(f);
    m.local_failed_phase.store(now, std::memory_order_release);
  } catch (...) {
    return;  // out of memory while describing: the peers will time out instead
  }
  m.wake_comm.notify_one();
}

void group::set_device_abort_listener(device_abort_listener* listener) noexcept {
  std::lock_guard lock(impl_->listener_mutex);
  impl_->device_listener = listener;
}

void group::report_device_abort(const std::string& why) noexcept {
  impl& m = *impl_;
  try {
    std::lock_guard lock(m.mutex);
    if (m.shut_down || m.W == 1) return;
    m.device_abort = why;
  } catch (...) {
    return;  // out of memory: the peers time out instead
  }
  m.wake_comm.notify_one();
}

}  // namespace mirror::mpi
