// SPDX-License-Identifier: Apache-2.0
// Completing a failed run's collectives on every worker, so that the next run pairs its
// collectives right (docs/multi-worker.md#failures: after an exception in fn).

#include <mirror/backends/mpi/group/impl.hpp>

namespace mirror::mpi {

void group::impl::note_local_failure() {
  const std::int64_t failed = local_failed_phase.load(std::memory_order_acquire);
  if (failed > drained && failed > pending) pending = failed;
}

void group::impl::throw_failure() {
  std::lock_guard lock(mutex);
  const int from = failure.replica / R;
  if (from == w) throw backend::collective_cancelled_rethrow_me{};
  switch (failure.kind) {
    case failed_shape: throw shape_error(failure.text);
    case failed_timeout: throw timeout_error(failure.text, failure.missing);
    default: throw replica_error(failure.replica, detail::format("worker %d: %s", from, failure.text.c_str()).c_str());
  }
}

void group::impl::throw_if_failed(std::int64_t ph) {
  bool failed = false;
  {
    std::lock_guard lock(mutex);
    failed = failure.phase == ph;
  }
  if (failed) throw_failure();
}

std::int64_t group::impl::count_through(std::int64_t failed) const {
  for (const auto& [ph, seq] : phase_starts) {
    if (ph > failed) return seq;
  }
  return sequence;
}

void group::impl::learn_failure(int from, const std::vector<char>& bytes) {
  std::int64_t head[head_words] = {};
  if (bytes.size() < sizeof head) return;
  std::memcpy(head, bytes.data(), sizeof head);
  const std::int64_t failed = head[0], n = head[3], m = head[5];
  if (failed == leaving) {
    left[static_cast<std::size_t>(from)] = 1;
    return;
  }
  if (n < 0 || m < 0 ||
      bytes.size() < sizeof head + (static_cast<std::size_t>(n) * posted_words + static_cast<std::size_t>(m)) *
                                       sizeof(std::int64_t)) {
    return;
  }
  status st;
  st.count = head[2];
  const char* at = bytes.data() + sizeof head;
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t words[posted_words];
    std::memcpy(words, at, sizeof words);
    at += sizeof words;
    st.posts.push_back({words[0], words[1], words[2], words[3], words[4], failed});
  }
  std::vector<int> missing(static_cast<std::size_t>(m));
  for (int& id : missing) {
    std::int64_t word = 0;
    std::memcpy(&word, at, sizeof word);
    at += sizeof word;
    id = static_cast<int>(word);
  }
  const std::string text(at, bytes.data() + bytes.size());
  if (failed <= drained) return;  // a status of a run already recovered from cannot come: ignore
  auto& got = statuses[failed];
  if (got.empty()) got.resize(static_cast<std::size_t>(W));
  got[static_cast<std::size_t>(from)] = std::move(st);
  {
    std::lock_guard lock(mutex);
    const int replica = static_cast<int>(head[1]);
    if (failure.phase < failed || (failure.phase == failed && replica < failure.replica)) {
      failure = {failed, replica, text, head[4], std::move(missing)};
    }
  }
  if (failed > pending) pending = failed;
}

void group::impl::send_status(std::int64_t failed, const status& mine) {
  failure_info f;
  {
    std::lock_guard lock(mutex);
    f = failure;
  }
  const std::int64_t head[head_words] = {failed, f.replica, mine.count, static_cast<std::int64_t>(mine.posts.size()),
                                         f.kind, static_cast<std::int64_t>(f.missing.size())};
  std::vector<char> bytes(sizeof head + (mine.posts.size() * posted_words + f.missing.size()) * sizeof(std::int64_t) +
                          f.text.size());
  char* at = bytes.data();
  std::memcpy(at, head, sizeof head);
  at += sizeof head;
  for (const posted_op& o : mine.posts) {
    const std::int64_t words[posted_words] = {o.seq, o.kind, o.count, o.element, o.op};
    std::memcpy(at, words, sizeof words);
    at += sizeof words;
  }
  for (const int id : f.missing) {
    const std::int64_t word = id;
    std::memcpy(at, &word, sizeof word);
    at += sizeof word;
  }
  if (!f.text.empty()) std::memcpy(at, f.text.data(), f.text.size());
  for (int p = 0; p < W; ++p) {
    if (p != w) send(p, tag_failure, bytes.data(), bytes.size(), nullptr);
  }
}

void group::impl::post_dummy(const posted_op& o, dummy& d) {
  const detail::element_kind k = detail::element_kind::from_code(o.element);
  const std::size_t n = static_cast<std::size_t>(o.count);
  const char* what = "recovery from a failed run";
  log_post(static_cast<post_kind>(o.kind), n, o.element, o.op);
  switch (o.kind) {
    case post_allreduce: {
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, n * k.bytes));
      check(post_iallreduce(d.buffer.get(), n, k, static_cast<ReduceOp>(o.op), d.request), "MPI_Iallreduce", what);
      return;
    }
    case post_agreement: {
      // A slot of zero keys (this worker's, where the check is messages): it matches the check,
      // which fails on the workers that made it; a wide check among them too.
      d.buffer = std::make_unique<unsigned char[]>(exchange_bytes());  // zeros
      d.requests.resize(std::max(1, 2 * (W - 1)));
      d.requests.resize(static_cast<std::size_t>(post_slots(d.buffer.get(), sizeof(agreement_slot), o.count != 0, k,
                                                            static_cast<ReduceOp>(o.op), d.requests.data(), what)));
      return;
    }
    case post_gather_messages:
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) * n));
      d.requests.resize(2 * static_cast<std::size_t>(W - 1));
      post_blocks(d.buffer.get(), d.buffer.get() + static_cast<std::size_t>(w) * n, n, tag_gather, d.requests.data(), what);
      return;
    case post_scatter_cuts:
    case post_gather_cuts: {
      // Zeros sent from one row, every message received into its own row (rows of the
      // largest cut), with the round's own sizes.
      const std::size_t row = backend::cut_of(n, W, 0).second * k.bytes;
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) * row));
      d.rows = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, row));
      d.requests.resize(2 * static_cast<std::size_t>(W - 1));
      post_cut_round(n, k.bytes, o.kind == post_scatter_cuts,
                     [&](int p) { return d.buffer.get() + static_cast<std::size_t>(p) * row; },
                     [&](int) { return d.rows.get(); }, d.requests.data(), what);
      return;
    }
    case post_bcast:
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, n));
      check(MPI_Ibcast(d.buffer.get(), static_cast<int>(n), MPI_BYTE, static_cast<int>(o.op), data, &d.request),
            "MPI_Ibcast", what);
      return;
    case post_allgather_words:
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, (n + n * static_cast<std::size_t>(W)) *
                                                                                sizeof(std::int64_t)));
      check(MPI_Iallgather(d.buffer.get(), static_cast<int>(n), MPI_INT64_T, d.buffer.get() + n * sizeof(std::int64_t),
                           static_cast<int>(n), MPI_INT64_T, data, &d.request),
            "MPI_Iallgather", what);
      return;
    case post_alltoall:
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) * n * k.bytes));
      d.rows = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) * n * k.bytes));
      check(MPI_Ialltoall(d.buffer.get(), static_cast<int>(n), datatype_of(k), d.rows.get(), static_cast<int>(n),
                          datatype_of(k), data, &d.request),
            "MPI_Ialltoall", what);
      return;
    case post_allgather_bytes:
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W + 1) * n));
      if (o.op == 1) {
        check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d.buffer.get(), static_cast<int>(n), MPI_BYTE, data,
                             &d.request),
              "MPI_Iallgather", what);
      } else {
        check(MPI_Iallgather(d.buffer.get(), static_cast<int>(n), MPI_BYTE, d.buffer.get() + n, static_cast<int>(n),
                             MPI_BYTE, data, &d.request),
              "MPI_Iallgather", what);
      }
      return;
    case post_alltoallv:
    case post_allgatherv: {
      slices(n, d.counts, d.displs);
      const int mine = d.counts[static_cast<std::size_t>(w)];
      const MPI_Datatype type = datatype_of(k);
      d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, n * k.bytes));
      if (o.kind == post_allgatherv) {
        check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d.buffer.get(), d.counts.data(), d.displs.data(),
                              type, data, &d.request),
              "MPI_Iallgatherv", what);
        return;
      }
      d.from.assign(static_cast<std::size_t>(W), mine);
      d.at.assign(static_cast<std::size_t>(W), 0);
      for (int p = 0; p < W; ++p) d.at[static_cast<std::size_t>(p)] = p * mine;
      d.rows = std::make_unique<unsigned char[]>(
          std::max<std::size_t>(1, static_cast<std::size_t>(W) * static_cast<std::size_t>(mine) * k.bytes));
      check(MPI_Ialltoallv(d.buffer.get(), d.counts.data(), d.displs.data(), type, d.rows.get(), d.from.data(),
                           d.at.data(), type, data, &d.request),
            "MPI_Ialltoallv", what);
      return;
    }
    default:
      throw backend_error(detail::format("mirror::devices::Cluster: recovery from a failed run: another worker reports "
                                         "a collective of unknown kind %lld",
                                         static_cast<long long>(o.kind)),
                          -1);
  }
}

void group::impl::recover(std::int64_t failed, std::span<MPI_Request> interrupted) {
  // Advances the interrupted post; true once it has completed.
  const auto test_interrupted = [&] {
    int done = 1;
    if (!interrupted.empty()) {
      check(MPI_Testall(static_cast<int>(interrupted.size()), interrupted.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall (recovery)");
    }
    return done != 0;
  };
  const auto start = clock::now();
  const auto deadline = start + timeout;
  auto& got = statuses[failed];
  if (got.empty()) got.resize(static_cast<std::size_t>(W));
  status mine;
  mine.count = count_through(failed);
  for (const posted_op& o : posts) {
    if (o.phase == failed && o.seq <= mine.count) mine.posts.push_back(o);
  }
  send_status(failed, mine);
  got[static_cast<std::size_t>(w)] = std::move(mine);
  // 1. Every worker's status (each sends one as it learns of the failure).
  for (;;) {
    if (std::all_of(got.begin(), got.end(), [](const auto& st) { return st.has_value(); })) break;
    if (clock::now() >= deadline) give_up(failed, start, "answer", nullptr);
    serve_control();
    progress_sends();
    test_interrupted();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // 2. Dummies up to the most any worker posted.
  std::int64_t most = 0;
  for (const auto& st : got) most = std::max(most, st->count);
  const std::int64_t own = got[static_cast<std::size_t>(w)]->count;
  std::vector<dummy> dummies;
  if (own < most) {
    if (sequence != own) {
      fail_recovery(detail::format("this worker has posted later collectives (%lld) than the failed run's, while "
                                   "another posted %lld more of the failed run's: the workers' programs diverged",
                                   static_cast<long long>(sequence - own), static_cast<long long>(most - own))
                        .c_str());
    }
    const std::int64_t outer_phase = job_phase;
    job_phase = failed;
    dummies.resize(static_cast<std::size_t>(most - own));
    for (std::int64_t k = own + 1; k <= most; ++k) {
      const posted_op* found = nullptr;
      for (const auto& st : got) {
        for (const posted_op& o : st->posts) {
          if (o.seq == k) found = &o;
        }
      }
      if (found == nullptr) {
        job_phase = outer_phase;
        fail_recovery(
            detail::format("no worker described collective %lld of the failed run", static_cast<long long>(k)).c_str());
      }
      post_dummy(*found, dummies[static_cast<std::size_t>(k - own - 1)]);
    }
    job_phase = outer_phase;
  }
  // 3. This worker's outstanding post of the run and its dummies complete.
  for (;;) {
    bool all_done = test_interrupted();
    for (dummy& d : dummies) {
      int done = 1;
      if (d.request != MPI_REQUEST_NULL) check(MPI_Test(&d.request, &done, MPI_STATUS_IGNORE), "MPI_Test (recovery)");
      all_done = all_done && done;
      if (d.requests.empty()) continue;
      check(MPI_Testall(static_cast<int>(d.requests.size()), d.requests.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall (recovery)");
      all_done = all_done && done;
    }
    if (all_done) break;
    if (clock::now() >= deadline) give_up(failed, start, "complete the failed run's collectives", &dummies);
    serve_control();
    progress_sends();
  }
  drained = failed;
  statuses.erase(statuses.begin(), statuses.upper_bound(failed));
}

void group::impl::leave() {
  if (W == 1 || is_broken()) return;
  const auto deadline = clock::now() + timeout;
  try {
    note_local_failure();
    if (pending > drained) recover(pending, {});
    const std::int64_t head[head_words] = {leaving, 0, 0, 0, 0, 0};
    for (int p = 0; p < W; ++p) {
      if (p != w) send(p, tag_failure, head, sizeof head, nullptr);
    }
    while (std::count(left.begin(), left.end(), 1) < W - 1 && clock::now() < deadline) {
      serve_control();
      progress_sends();
      if (pending > drained) recover(pending, {});
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  } catch (...) {
    // A recovery that timed out, or an MPI error: leave anyway.
  }
}

void group::impl::fail_recovery(const std::string& why) {
  if (const auto lost = lose_if_failed()) std::rethrow_exception(lost);
  const std::string text = "mirror::devices::Cluster: cannot recover from a failed run: " + why;
  {
    std::lock_guard lock(mutex);
    if (broken.why == broken_state::none) broken = {broken_state::mpi_error, -1, text, {}, {}};
  }
  throw backend_error(text, -1);
}

void group::impl::give_up(std::int64_t failed, clock::time_point start, const char* step,
                          std::vector<dummy>* dummies) {
  std::vector<int> missing;
  std::string names;
  const auto& got = statuses[failed];
  for (int p = 0; p < W; ++p) {
    if (got[static_cast<std::size_t>(p)].has_value() && dummies == nullptr) continue;
    if (p == w) continue;
    names += detail::format("%s%d", names.empty() ? "" : ", ", p).c_str();
    for (int r = 0; r < R; ++r) missing.push_back(p * R + r);
  }
  if (dummies != nullptr) {
    for (dummy& d : *dummies) {
      if (d.request != MPI_REQUEST_NULL) abandoned.push_back(d.request);
      for (const MPI_Request r : d.requests) {
        if (r != MPI_REQUEST_NULL) abandoned.push_back(r);
      }
      keep_until_exit(d.buffer);
      keep_until_exit(d.rows);
    }
  }
  if (const auto lost = lose_if_failed()) std::rethrow_exception(lost);  // not late: gone
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
  const std::string text = detail::format("mirror: worker %d waited %lld ms for workers {%s} to %s after a run failed; "
                                          "raise devices::Cluster{.timeout} if they are just slow",
                                          w, static_cast<long long>(waited), names.c_str(), step)
                               .c_str();
  std::lock_guard lock(mutex);
  broken = {broken_state::timeout, -1, text, missing, {}};
  throw timeout_error(text, missing);
}

}  // namespace mirror::mpi
