// SPDX-License-Identifier: Apache-2.0
// The communication thread of a worker's group: the hand-off of a job from its caller, the
// polling of a posted collective, the control communicator (who-has-arrived queries, failure and
// timeout notices) and the timeouts (docs/multi-worker.md#failures).

#include <mirror/backends/mpi/group/impl.hpp>

namespace mirror::mpi {

std::exception_ptr group::impl::broken_error() const {
  const std::string tail =
      "; Open MPI cannot cancel a posted collective, so this strategy cannot continue: end the job and restart "
      "it from the last checkpoint (mirror::restore)";
  switch (broken.why) {
    case broken_state::timeout: return std::make_exception_ptr(timeout_error(broken.text + tail, broken.missing));
    case broken_state::mpi_error:
      return std::make_exception_ptr(backend_error("mirror::devices::Cluster: an earlier MPI error: " + broken.text + tail, -1));
    case broken_state::workers_lost: return std::make_exception_ptr(worker_lost_error(broken.text, broken.lost, broken.missing));
    case broken_state::none: break;
  }
  return nullptr;
}

void group::impl::post(job& j) {
  // Which call of the program this is, read on the caller's thread (both are the caller's).
  j.position = detail::current_position;
  j.phase = phase.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex);
  if (shut_down) {
    throw backend_error("mirror::devices::Cluster: MPI was finalized while the strategy exists; destroy the "
                        "strategy before MPI_Finalize (or let mirror finalize MPI at exit)", -1);
  }
  if (broken.why != broken_state::none) std::rethrow_exception(broken_error());
  queue.push_back(&j);
  posted_at.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  posted.store(true, std::memory_order_release);
  wake_comm.notify_one();  // no system call when the thread is spinning rather than parked
}

void group::impl::await(job& j) {
  spin_for(j.done, [&] { return j.done_at; }, clock::now(), caller_spin);
  std::unique_lock lock(mutex);
  wake_caller.wait(lock, [&] { return j.done.load(std::memory_order_relaxed); });
  if (j.error) std::rethrow_exception(j.error);
}

void group::impl::shutdown() {
  {
    std::lock_guard lock(mutex);
    if (shut_down) return;
    stop = true;
  }
  wake_comm.notify_one();
  if (thread.joinable()) thread.join();
  std::lock_guard lock(mutex);
  shut_down = true;
  // A broken group has collectives that will never complete on its communicators: leave them
  // (freeing them could wait forever); the job is ending anyway.
  ring_algorithm.close();
  if (broken.why == broken_state::none && abandoned.empty()) {
    MPI_Comm_free(&data);
    MPI_Comm_free(&control);
  }
}

int group::impl::on_finalize(MPI_Comm, int, void* attribute, void*) {
  static_cast<impl*>(attribute)->shutdown();
  return MPI_SUCCESS;
}

bool group::impl::drive(job& j) {
  std::unique_lock turn(driver, std::try_to_lock);
  if (!turn.owns_lock()) return false;  // the communication thread is in a round: hand the job over
  {
    std::lock_guard lock(mutex);
    // Behind queued jobs, or on a group that is ending or broken (post() says so): the usual way.
    if (!queue.empty() || stop || shut_down || broken.why != broken_state::none) return false;
  }
  j.position = detail::current_position;
  j.phase = phase.load(std::memory_order_relaxed);
  // As the communication thread before each job: a notice may be waiting (a worker that gave up
  // waiting for this one makes this job fail at once, as the late one).
  try {
    serve_control();
    progress_sends();
  } catch (...) {
    mark_broken_mpi(std::current_exception());
  }
  execute(j);
  if (j.error) std::rethrow_exception(j.error);
  return true;
}

void group::impl::main_loop() {
  for (bool after_job = false;;) {
    // Right after a collective the next one usually follows at once (a training step's leaves,
    // a loop of all-reduces): spin for it briefly instead of parking, saving the wake-up.
    if (after_job) {
      spin_for(posted, [&] { return posted_at.load(std::memory_order_relaxed); }, clock::now(), idle_spin);
    }
    bool work = false;
    {
      std::unique_lock lock(mutex);
      // Idle: still serve the control communicator every millisecond (a late worker must
      // answer "which collective have you entered" while its replicas compute).
      work = wake_comm.wait_for(lock, std::chrono::milliseconds(1), [&] {
        return stop || !queue.empty() || device_abort ||
               local_failed_phase.load(std::memory_order_relaxed) > drained.load(std::memory_order_relaxed);
      });
    }
    // A caller may be running its own job (drive()). With work to do, this round waits for it to
    // end. The millisecond's round does not: that caller serves the control communicator while it
    // waits, and blocking here would make each of its collectives wake this thread to find the
    // lock taken again (3 workers on 2 cores: this thread then took 15 % of a core).
    std::unique_lock turn(driver, std::try_to_lock);
    if (!turn.owns_lock()) {
      if (!work) {
        after_job = false;  // nor spin for a job: the caller is making its own
        continue;
      }
      turn.lock();
    }
    job* j = nullptr;
    bool stopping = false;
    {
      std::lock_guard lock(mutex);
      if (!queue.empty()) {
        j = queue.front();
        queue.pop_front();
        posted.store(!queue.empty(), std::memory_order_relaxed);
      }
      stopping = stop && queue.empty();  // a posted job is executed (its caller waits for it)
    }
    after_job = j != nullptr;
    try {
      if (!is_lost()) {
        serve_control();
        progress_sends();
      }
      // A run failed here or on another worker: recover now, while this thread is free (the
      // others wait for this worker's answer), not when the next job comes.
      note_local_failure();
      if (pending > drained && !is_broken()) recover(pending, {});
    } catch (const timeout_error&) {
      // recover() gave up on a worker and marked the group broken; later jobs throw it.
    } catch (...) {
      mark_broken_mpi(std::current_exception());
    }
    if (j != nullptr) {
      execute(*j);
      std::lock_guard lock(mutex);
      j->done_at = clock::now().time_since_epoch().count();
      j->done.store(true, std::memory_order_release);
      wake_caller.notify_all();
    }
    if (stopping) {
      leave();
      flush_sends();
      return;
    }
  }
}

void group::impl::mark_broken_mpi(const std::exception_ptr& e) {
  if (lose_if_failed()) return;
  std::lock_guard lock(mutex);
  if (broken.why == broken_state::none) broken = {broken_state::mpi_error, -1, what_of(e), {}, {}};
}

void group::impl::wait(std::span<MPI_Request> requests, const char* what) {
  auto start = clock::now();
  auto deadline = start + timeout;
  const auto abandon = [&] {
    for (const MPI_Request r : requests) {
      if (r != MPI_REQUEST_NULL) abandoned.push_back(r);
    }
  };
  for (unsigned polls = 0;; ++polls) {
    int done = 0;
    if (requests.size() == 1) {
      check(MPI_Test(&requests[0], &done, MPI_STATUS_IGNORE), "MPI_Test", what);
    } else {
      check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall",
            what);
    }
    if (done) return;
    // The control communicator, the failure flag and the clock every 8th poll only: MPI_Test
    // is what moves the collective along, the rest is bookkeeping (a probe costs a progress
    // call).
    if ((polls & 7) != 7) continue;
    serve_control();
    progress_sends();
    if (remote) {  // another worker gave up waiting for this one
      abandon();
      time_out(start, what);
    }
    note_local_failure();
    if (pending > drained && pending <= job_phase) {
      const std::int64_t failed = pending;
      try {
        recover(failed, failed == job_phase ? requests : std::span<MPI_Request>());
      } catch (...) {
        abandon();
        throw;
      }
      if (failed == job_phase) throw_failure();
      start = clock::now();  // the peers were recovering too: this collective's wait starts now
      deadline = start + timeout;
      continue;
    }
    const auto now = clock::now();
    if (now >= deadline) {
      abandon();
      time_out(start, what);
    }
    // Never sleep for the first second: Open MPI's shared-memory and libnbc collectives
    // advance only inside MPI calls, so a sleeping comm thread stalls its peers too (the 20 us
    // sleeps this loop had after 200 us put 5.8 % of a 1 MiB run's samples in do_nanosleep,
    // each costing ~80 us with timer slack). Nor yield for the first `unyielding_wait`: the
    // caller spins with yields beside this thread, and handing it the core mid-collective
    // stalls the exchange for the peers as well; as in a blocking MPI_Allreduce (which spins
    // in opal_progress) this thread keeps the core. After that, a yield every 8 tests (a
    // transfer that long is bandwidth-bound; a late worker needs the cores), and after a
    // second (a straggler, not a slow transfer) 100 us sleeps, so waiting burns no core.
    if (now - start < std::chrono::seconds(1)) {
      if (oversubscribed || now - start >= unyielding_wait) std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void group::impl::adopt_remote(job&) {
  std::lock_guard lock(mutex);
  broken = *remote;
  broken.missing.clear();
  for (int r = 0; r < R; ++r) broken.missing.push_back(w * R + r);
  std::rethrow_exception(broken_error());
}

void group::impl::time_out(clock::time_point start, const char*) {
  if (const auto lost = lose_if_failed()) std::rethrow_exception(lost);  // not late: gone
  // The wait itself, measured before the peers are asked (asking takes up to 5 s more).
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
  const std::int64_t seq = sequence;
  asked = seq;
  replies.assign(static_cast<std::size_t>(W), -1);
  reply_sites.assign(static_cast<std::size_t>(W), std::string());
  replies[static_cast<std::size_t>(w)] = seq;
  // A worker that already told us it entered this collective (its own query or its notice
  // that it gave up) has arrived, even if it has shut down since and cannot answer.
  for (int p = 0; p < W; ++p) {
    if (known[static_cast<std::size_t>(p)] >= seq) replies[static_cast<std::size_t>(p)] = known[static_cast<std::size_t>(p)];
  }
  for (int p = 0; p < W; ++p) {
    if (p != w) send(p, tag_query, &seq, sizeof seq, nullptr);
  }
  const auto reply_deadline = clock::now() + std::min<clock::duration>(timeout, std::chrono::seconds(5));
  while (clock::now() < reply_deadline &&
         std::count(replies.begin(), replies.end(), std::int64_t{-1}) > 0) {
    serve_control();
    progress_sends();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  asked = -1;
  std::vector<int> missing;
  std::string late, unreachable, last_calls;
  for (int p = 0; p < W; ++p) {
    const std::int64_t got = replies[static_cast<std::size_t>(p)];
    if (got >= seq) continue;
    (got < 0 ? unreachable : late) +=
        detail::format("%s%d", got < 0 ? (unreachable.empty() ? "" : ", ") : (late.empty() ? "" : ", "), p).c_str();
    for (int r = 0; r < R; ++r) missing.push_back(p * R + r);
    const std::string& site = reply_sites[static_cast<std::size_t>(p)];
    if (got >= 0) {
      last_calls += detail::format("; worker %d's last cross-worker call was %s", p,
                                   site.empty() ? "none yet" : site.c_str())
                        .c_str();
    }
  }
  std::string names;
  for (int m : missing) names += detail::format("%s%d", names.empty() ? "" : ", ", m).c_str();
  const auto limit = static_cast<long long>(timeout.count());
  std::string text = detail::format("mirror: worker %d", w).c_str();
  if (remote && remote->why == broken_state::timeout) {
    text += detail::format(" waited %lld ms in %s until worker %d gave up waiting for it", static_cast<long long>(waited),
                           where_text().c_str(), remote->replica / R)
                .c_str();
  } else {
    text += detail::format(" waited for the timeout of %lld ms (devices::Cluster{.timeout})", limit).c_str();
    // A wait restarts after a recovery from another worker's failure; say so when it shows.
    if (waited > limit + limit / 10 + 100) {
      text += detail::format(" (%lld ms in all, with a recovery)", static_cast<long long>(waited)).c_str();
    }
    text += " in " + where_text();
  }
  text += "; replicas {" + names + "} did not reach this collective";
  if (!late.empty()) {
    text += detail::format(" (%s %s answered: %s at an earlier collective or computing%s)",
                           late.find(',') == std::string::npos ? "worker" : "workers", late.c_str(),
                           late.find(',') == std::string::npos ? "it is" : "they are", last_calls.c_str())
                .c_str();
  }
  if (!unreachable.empty()) {
    text += detail::format(" (%s %s did not answer within %lld ms either: busy outside mirror, or gone)",
                           unreachable.find(',') == std::string::npos ? "worker" : "workers", unreachable.c_str(),
                           std::min<long long>(limit, 5000))
                .c_str();
  }
  // The error comes after the wait and the questions: say how long that was in all, where the
  // questions added to it (a worker that does not answer costs up to 5 s more).
  const auto in_all = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
  if (in_all > waited + 500) {
    text += detail::format("; %.1f s passed in all, %.1f s of them asking the other workers where they are",
                           static_cast<double>(in_all) / 1000.0, static_cast<double>(in_all - waited) / 1000.0)
                .c_str();
  }
  if (missing.empty()) text += " (every worker says it arrived: the network is slow or partitioned)";
  text += "; raise devices::Cluster{.timeout} if they are just slow";
  announce(notice_timeout, w * R, seq, text);
  std::lock_guard lock(mutex);
  broken = {broken_state::timeout, -1, text, missing, {}};
  throw timeout_error(text, missing);
}

bool group::impl::is_broken() {
  std::lock_guard lock(mutex);
  return broken.why != broken_state::none;
}

bool group::impl::is_lost() {
  std::lock_guard lock(mutex);
  return broken.why == broken_state::workers_lost;
}

void group::impl::announce(std::int64_t kind, int replica, std::int64_t seq, const std::string& text) {
  std::vector<char> bytes(3 * sizeof(std::int64_t) + text.size());
  const std::int64_t head[3] = {kind, replica, seq};
  std::memcpy(bytes.data(), head, sizeof head);
  std::memcpy(bytes.data() + sizeof head, text.data(), text.size());
  for (int p = 0; p < W; ++p) {
    if (p != w) send(p, tag_notice, bytes.data(), bytes.size(), nullptr);
  }
}

void group::impl::send(int dest, int tag, const void* bytes, std::size_t n, MPI_Request*) {
  pending_send& s = sends.emplace_back();
  s.bytes.assign(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
  check(MPI_Isend(s.bytes.data(), static_cast<int>(n), MPI_BYTE, dest, tag, control, &s.request), "MPI_Isend (control)");
}

void group::impl::progress_sends() {
  for (auto it = sends.begin(); it != sends.end();) {
    int done = 0;
    check(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test (control send)");
    it = done ? sends.erase(it) : std::next(it);
  }
}

void group::impl::flush_sends() {
  const auto until = clock::now() + std::chrono::seconds(1);
  try {
    while (!sends.empty() && clock::now() < until) {
      serve_control();
      progress_sends();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  } catch (...) {
  }
}

void group::impl::serve_control() {
  // This worker's device communicators were aborted: the peers abort theirs now (NCCL needs every
  // rank to), instead of waiting on the GPU for the timeout.
  std::optional<std::string> aborted;
  {
    std::lock_guard lock(mutex);
    aborted.swap(device_abort);
  }
  if (aborted) announce(notice_device_abort, w * R, 0, *aborted);
  for (;;) {
    int flag = 0;
    MPI_Status status;
    check(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, control, &flag, &status), "MPI_Iprobe (control)");
    if (!flag) return;
    int n = 0;
    MPI_Get_count(&status, MPI_BYTE, &n);
    std::vector<char> bytes(static_cast<std::size_t>(std::max(n, 0)));
    check(MPI_Recv(bytes.data(), n, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, control, MPI_STATUS_IGNORE),
          "MPI_Recv (control)");
    const int from = status.MPI_SOURCE;
    std::int64_t head[3] = {0, 0, 0};
    std::memcpy(head, bytes.data(), std::min(bytes.size(), sizeof head));
    std::int64_t& seen = known[static_cast<std::size_t>(from)];
    if (status.MPI_TAG == tag_query) {
      seen = std::max(seen, head[0]);  // it asks about a collective it has entered
      // {entered, asked}, then where this worker's last cross-worker call is (its message names it).
      const std::string where = where_text();
      std::vector<char> reply(2 * sizeof(std::int64_t) + where.size());
      const std::int64_t numbers[2] = {sequence, head[0]};
      std::memcpy(reply.data(), numbers, sizeof numbers);
      std::memcpy(reply.data() + sizeof numbers, where.data(), where.size());
      send(from, tag_reply, reply.data(), reply.size(), nullptr);
    } else if (status.MPI_TAG == tag_reply) {
      seen = std::max(seen, head[0]);
      if (head[1] == asked && asked >= 0) {
        replies[static_cast<std::size_t>(from)] = head[0];
        const std::size_t text_at = 2 * sizeof(std::int64_t);
        reply_sites[static_cast<std::size_t>(from)] =
            bytes.size() > text_at ? std::string(bytes.begin() + text_at, bytes.end()) : std::string();
      }
    } else if (status.MPI_TAG == tag_notice && head[0] == notice_timeout) {
      seen = std::max(seen, head[2]);  // it gave up waiting in that collective
    } else if (status.MPI_TAG == tag_failure) {
      learn_failure(from, bytes);
    }
    // A notice's text follows its head.
    auto notice_text = [&] {
      return std::string(bytes.begin() + static_cast<std::ptrdiff_t>(std::min(bytes.size(), sizeof head)), bytes.end());
    };
    if (status.MPI_TAG == tag_notice && head[0] == notice_device_abort) {
      const std::string text = notice_text();
      std::lock_guard lock(listener_mutex);
      if (device_listener != nullptr) device_listener->peer_aborted(from, text);
    }
    if (status.MPI_TAG == tag_notice && head[0] == notice_timeout && !remote) {
      broken_state s;
      s.why = broken_state::timeout;
      s.replica = static_cast<int>(head[1]);
      s.text = detail::format("mirror: worker %d gave up waiting for this worker: ", from).c_str() + notice_text();
      remote = s;
    }
  }
}

}  // namespace mirror::mpi
