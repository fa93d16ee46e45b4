// SPDX-License-Identifier: Apache-2.0
// The MPI collectives a job posts, and the agreement check before each (docs/multi-worker.md#failures:
// how workers tell calls apart).

#include <mirror/backends/mpi/group/impl.hpp>
#include <mirror/backend/segment_list.hpp>

namespace mirror::mpi {

namespace {
std::string site_text(const detail::collective_position& position, std::size_t room) {
  if (position.where.line() == 0 || room == 0) return {};
  std::string site = detail::site_text(position.where).c_str();
  if (site.size() >= room) site.erase(0, site.size() - (room - 1));
  return site;
}
}  // namespace

std::string group::impl::site_of(const job& j, std::size_t room) { return site_text(j.position, room); }

std::string group::impl::where_of(const char* what, const detail::collective_position& position) {
  const std::string site = site_text(position, 4096);
  if (position.sequence == 0) return site.empty() ? std::string(what) : std::string(what) + " at " + site;
  return detail::format("collective #%llu (%s) of fn at %s, its cross-worker step",
                        static_cast<unsigned long long>(position.sequence),
                        detail::to_string(position.kind, position.param).text, site.c_str())
      .c_str();
}

namespace {
// A span of the worker's MPI track from construction to destruction (none without one).
struct job_span {
  detail::trace_track* track;
  const char* name;
  std::int64_t begin = track != nullptr ? detail::trace_now() : 0;
  ~job_span() {
    if (track != nullptr) track->span(name, detail::trace_kind::job, begin);
  }
};
}  // namespace

const char* group::impl::job_name(const job& j) noexcept {
  switch (j.kind) {
    case job::check: return "agreement check only";
    case job::reduce: return "all-reduce (MPI)";
    case job::bcast: return "broadcast (MPI)";
    case job::scatter: return "reduce-scatter (MPI)";
    case job::gather: return "all-gather (MPI)";
    case job::counts: return "all-gather of counts (MPI)";
  }
  return "MPI";
}

void group::impl::execute(job& j) {
  const job_span traced{trace, job_name(j)};
  where_what = j.what;
  where_position = j.position;
  job_phase = j.phase;
  if (phase_starts.empty() || phase_starts.back().first < j.phase) {
    phase_starts.emplace_back(j.phase, sequence);
    if (phase_starts.size() > 64) phase_starts.erase(phase_starts.begin());
  }
  try {
    {
      std::lock_guard lock(mutex);
      if (broken.why != broken_state::none) std::rethrow_exception(broken_error());
      if (j.phase <= refused_through) std::rethrow_exception(refusal);
    }
    if (remote) adopt_remote(j);  // a timeout notice arrived while we were idle
    // A failed run is recovered from before anything later is posted; the failed run's own
    // later collectives are not posted at all.
    note_local_failure();
    if (pending > drained && pending <= j.phase) recover(pending, {});
    throw_if_failed(j.phase);
    // An all-gather's counts were gathered (and checked) just before: equal on every worker.
    const bool check_first =
        j.kind == job::check || (validate && !((j.kind == job::reduce || j.kind == job::gather) && j.checked));
    dispatch(j, check_first);
  } catch (const backend_error&) {
    j.error = std::current_exception();
    if (auto lost = lose_if_failed()) {  // a dead worker, not a broken MPI
      j.error = std::move(lost);
      return;
    }
    std::lock_guard lock(mutex);
    if (broken.why == broken_state::none) broken = {broken_state::mpi_error, -1, what_of(j.error), {}, {}};
  } catch (...) {
    j.error = std::current_exception();
  }
}

void group::impl::dispatch(job& j, bool check_first) {
  // A small reduction's elements ride in the agreement check's message: one collective, not
  // two. Without a check to make, that message is still the cheapest where it is direct
  // messages (no libnbc schedule to build).
  const bool rides = carries(j) && (check_first || W <= direct_agreement);
  // Several leaves go where they are (all_reduce_in_pieces), unless these paths need one buffer.
  const bool worker_order_fold =
      j.kind == job::reduce && j.in_worker_order && !reduces_by_messages(j.count, j.element);
  if (j.leaf_counts != nullptr && j.data == nullptr && (rides || worker_order_fold)) {
    return reduce_packed(j, check_first);
  }
  if (rides) {
    const job_span carried{trace, check_first ? "agreement check carrying the data" : "small reduction (messages)"};
    return agree(j, true, check_first);
  }
  if (check_first) {
    const job_span checking{trace, "agreement check"};
    agree(j);
  }
  if (j.kind == job::check) return;
  // An empty payload still waits for every worker (MPI completes an empty collective at
  // once, alone): a worker whose run failed before this collective must fail it here too.
  // The agreement check, where there was one, did.
  if ((j.kind == job::reduce || j.kind == job::bcast || j.kind == job::scatter) && j.count == 0) {
    if (!check_first) sync(j);
    return;
  }
  if (j.kind == job::scatter) return scatter(j);
  if (j.kind == job::gather) return gather(j);
  if (j.kind == job::counts) return gather_counts(j);
  if (worker_order_fold) {
    reduce_in_worker_order(j);
    return;
  }
  if (j.kind == job::reduce) {
    all_reduce_in_pieces(static_cast<unsigned char*>(j.data), j.count, j.element, j.op, "MPI_Iallreduce", j.what,
                         nullptr, j.data == nullptr ? &j : nullptr);
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  log_post(post_bcast, j.count, 0, j.root);
  check(MPI_Ibcast(j.data, static_cast<int>(j.count), MPI_BYTE, j.root, data, &request), "MPI_Ibcast", j.what);
  wait(request, j.what);
}

void group::impl::reduce_packed(job& j, bool check_first) {
  unsigned char* const packed = payload[1].at_least(j.count * j.element.bytes);
  copy_from_leaves(j, 0, j.count, packed);
  j.data = packed;
  const std::size_t given_up = abandoned.size();
  try {
    dispatch(j, check_first);
  } catch (...) {
    if (abandoned.size() > given_up) keep_until_exit(payload[1].bytes);  // MPI may still write into it
    throw;
  }
  if (j.kind == job::reduce) copy_to_leaves(j, 0, j.count, packed);  // a scatter wrote its ranges out
}

void group::impl::copy_from_leaves(const job& j, std::size_t first, std::size_t n, unsigned char* to) {
  const std::size_t size = j.element.bytes;
  backend::for_each_piece(std::span<const std::size_t>(j.leaf_counts, j.num_leaves), first, first + n,
                          [&](std::size_t k, std::size_t at, std::size_t count, std::size_t from) {
                            std::memcpy(to + (from - first) * size,
                                        static_cast<const unsigned char*>(j.leaves[k]) + at * size, count * size);
                          });
}

void group::impl::copy_to_leaves(const job& j, std::size_t first, std::size_t n, const unsigned char* from) {
  const std::size_t size = j.element.bytes;
  backend::for_each_piece(std::span<const std::size_t>(j.leaf_counts, j.num_leaves), first, first + n,
                          [&](std::size_t k, std::size_t at, std::size_t count, std::size_t to) {
                            std::memcpy(static_cast<unsigned char*>(j.leaves[k]) + at * size,
                                        from + (to - first) * size, count * size);
                          });
}

void group::impl::copy_input(const job& j, std::size_t first, std::size_t n, unsigned char* to) {
  if (n == 0) return;
  if (j.data == nullptr) return copy_from_leaves(j, first, n, to);
  std::memcpy(to, static_cast<const unsigned char*>(j.data) + first * j.element.bytes, n * j.element.bytes);
}

void group::impl::slices(std::size_t n, std::vector<int>& counts, std::vector<int>& displs) const {
  counts.assign(static_cast<std::size_t>(W), 0);
  displs.assign(static_cast<std::size_t>(W), 0);
  for (int p = 0; p < W; ++p) {
    const auto [first, count] = backend::cut_of(n, W, p);
    displs[static_cast<std::size_t>(p)] = static_cast<int>(first);
    counts[static_cast<std::size_t>(p)] = static_cast<int>(count);
  }
}

void group::impl::reduce_in_worker_order(job& j) {
  const std::size_t bytes = j.element.bytes;
  std::vector<int> counts, displs;
  slices(j.count, counts, displs);
  const int mine = counts[static_cast<std::size_t>(w)];
  const MPI_Datatype type = datatype_of(j.element);
  std::vector<int> from(static_cast<std::size_t>(W), mine), at(static_cast<std::size_t>(W));
  for (int p = 0; p < W; ++p) at[static_cast<std::size_t>(p)] = p * mine;
  // Kept from job to job, and given up with the exchange if it is (keep_until_exit says why).
  unsigned char* const rows = payload[0].at_least(static_cast<std::size_t>(W) * static_cast<std::size_t>(mine) * bytes);
  log_post(post_alltoallv, j.count, j.element.code(), static_cast<std::int64_t>(j.op));
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ialltoallv(j.data, counts.data(), displs.data(), type, rows, from.data(), at.data(), type, data,
                       &request),
        "MPI_Ialltoallv (in worker order)", j.what);
  wait_keeping(request, j.what, payload[0].bytes);
  const std::size_t row = static_cast<std::size_t>(mine) * bytes;
  fold_rows(rows, row, static_cast<std::size_t>(mine), j.element, j.op, "MPI_Reduce_local (in worker order)",
            j.what);
  if (row != 0) {
    std::memcpy(static_cast<unsigned char*>(j.data) + static_cast<std::size_t>(displs[static_cast<std::size_t>(w)]) * bytes,
                rows, row);
  }
  log_post(post_allgatherv, j.count, j.element.code(), static_cast<std::int64_t>(j.op));
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, counts.data(), displs.data(), type, data,
                        &request),
        "MPI_Iallgatherv (in worker order)", j.what);
  wait(request, j.what);
}

void group::impl::all_reduce_in_pieces(unsigned char* buffer, std::size_t count, detail::element_kind kind,
                                       ReduceOp op, const char* call, const char* what,
                                       std::unique_ptr<unsigned char[]>* keep, const job* parts) {
  const std::size_t bytes = count * kind.bytes;
  const std::size_t pieces =
      bytes <= whole_all_reduce_bytes ? 1 : (bytes + all_reduce_piece_bytes - 1) / all_reduce_piece_bytes;
  // Decided on the whole count, so that every piece, and a reduce-scatter of the same count,
  // folds alike.
  const bool by_messages = reduces_by_messages(count, kind);
  for (std::size_t i = 0; i < pieces; ++i) {
    const auto [first, n] = backend::cut_of(count, static_cast<int>(pieces), static_cast<int>(i));
    unsigned char* at = parts == nullptr ? buffer + first * kind.bytes : nullptr;
    std::unique_ptr<unsigned char[]>* owner = keep;
    bool copied = false;
    if (parts != nullptr) {
      // The leaf holding the piece's first element (an empty one holds none), and whether the
      // piece ends in it too.
      std::size_t k = 0, start = 0;
      while (k + 1 < parts->num_leaves && start + parts->leaf_counts[k] <= first) start += parts->leaf_counts[k++];
      copied = first + n > start + parts->leaf_counts[k];
      if (copied) {
        at = payload[1].at_least(n * kind.bytes);
        owner = &payload[1].bytes;
        copy_from_leaves(*parts, first, n, at);
      } else {
        at = static_cast<unsigned char*>(parts->leaves[k]) + (first - start) * kind.bytes;
      }
    }
    if (by_messages) {
      reduce_by_messages(at, n, kind, op, what, owner);
    } else {
      log_post(post_allreduce, n, kind.code(), static_cast<std::int64_t>(op));
      MPI_Request request = MPI_REQUEST_NULL;
      check(post_iallreduce(at, n, kind, op, request), call, what);
      if (owner != nullptr) {
        wait_keeping(request, what, *owner);
      } else {
        wait(request, what);
      }
    }
    if (copied) copy_to_leaves(*parts, first, n, at);
  }
}

void group::impl::reduce_by_messages(unsigned char* buffer, std::size_t count, detail::element_kind kind, ReduceOp op,
                                     const char* what, std::unique_ptr<unsigned char[]>* keep) {
  op = op == ReduceOp::mean ? ReduceOp::sum : op;
  const std::size_t size = kind.bytes;
  const std::size_t row = backend::cut_of(count, W, 0).second * size;  // the largest cut's bytes
  const std::size_t mine = backend::cut_of(count, W, w).second;
  unsigned char* const rows = payload[2].at_least(static_cast<std::size_t>(W) * row);
  std::array<MPI_Request, 2 * (direct_agreement_max - 1)> requests;
  // MPI writes into the rows and, where it owns it, the buffer (wait_keeping).
  const auto wait_both = [&](int n) {
    const std::span<MPI_Request> posted(requests.data(), static_cast<std::size_t>(n));
    if (keep != nullptr) return wait_keeping(posted, what, payload[2].bytes, *keep);
    wait_keeping(posted, what, payload[2].bytes);
  };
  // Round 1: worker p's cut of this buffer to worker p; every worker's copy of this worker's cut
  // into its row, this worker's own copied meanwhile.
  const auto row_of = [&](int p) { return rows + static_cast<std::size_t>(p) * row; };
  const auto cut_in_buffer = [&](int p) { return buffer + backend::cut_of(count, W, p).first * size; };
  log_post(post_scatter_cuts, count, kind.code(), static_cast<std::int64_t>(op));
  int n = post_cut_round(count, size, true, row_of, cut_in_buffer, requests.data(), what);
  if (mine != 0) std::memcpy(row_of(w), cut_in_buffer(w), mine * size);
  wait_both(n);
  fold_rows(rows, row, mine, kind, op, "MPI_Reduce_local (reduction by messages)", what);
  // Round 2: the folded cut (row 0) to every other worker, and theirs into place.
  log_post(post_gather_cuts, count, kind.code(), static_cast<std::int64_t>(op));
  n = post_cut_round(count, size, false, cut_in_buffer, [&](int) { return rows; }, requests.data(), what);
  if (mine != 0) std::memcpy(cut_in_buffer(w), rows, mine * size);
  wait_both(n);
}

void group::impl::fold_rows(unsigned char* first, std::size_t stride, std::size_t count, detail::element_kind kind,
                            ReduceOp op, const char* call, const char* what) const {
  if (count == 0) return;
  const MPI_Datatype type = datatype_of(kind);
  for (int p = 1; p < W; ++p) {
    check(MPI_Reduce_local(first + static_cast<std::size_t>(p) * stride, first, static_cast<int>(count), type,
                           op_of(op, kind)),
          call, what);
  }
}

void group::impl::sync(job& j) {
  auto word = std::make_unique<std::int64_t[]>(1);
  word[0] = 0;
  log_post(post_allreduce, 1, int64_kind.code(), static_cast<std::int64_t>(ReduceOp::max));
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, word.get(), 1, MPI_INT64_T, MPI_MAX, data, &request),
        "MPI_Iallreduce (empty collective)", j.what);
  wait_keeping(request, j.what, word);
}

void group::impl::scatter(job& j) {
  const std::size_t K = j.num_sizes, bytes = j.element.bytes, Wn = static_cast<std::size_t>(W);
  const auto* in = static_cast<const unsigned char*>(j.data);
  const MPI_Datatype type = datatype_of(j.element);
  if (!scatter_by_worker(j)) {
    unsigned char* const whole = payload[0].at_least(j.count * bytes);
    copy_input(j, 0, j.count, whole);
    all_reduce_in_pieces(whole, j.count, j.element, j.op, "MPI_Iallreduce (reduce-scatter)", j.what,
                         &payload[0].bytes);
    keep_ranges(j, whole);
    return;
  }
  std::vector<std::size_t> per(Wn, 0);  // each worker's elements over all leaves
  for (int p = 0; p < W; ++p) per[static_cast<std::size_t>(p)] = visit_cut(j, p, [](std::size_t, std::size_t) {});
  const std::size_t block = *std::max_element(per.begin(), per.end());
  const std::size_t mine = per[static_cast<std::size_t>(w)];
  if (block > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(detail::format("%s: %zu elements per worker in one cross-worker reduce-scatter exceed "
                                               "MPI's int count; split the leaf",
                                               j.what, block)
                                    .c_str());
  }
  // One leaf whose ranges are equal is already laid out as W blocks: sent as it is.
  const bool direct =
      in != nullptr && K == 1 && std::all_of(per.begin(), per.end(), [&](std::size_t c) { return c == block; });
  // Kept from job to job, and given up with the exchange if it is (keep_until_exit says why).
  unsigned char* packed = nullptr;
  if (!direct) {
    packed = payload[1].at_least(Wn * block * bytes);
    for (int p = 0; p < W; ++p) pack_cut(j, p, packed + static_cast<std::size_t>(p) * block * bytes);
  }
  unsigned char* const rows = payload[0].at_least(Wn * block * bytes);
  log_post(post_alltoall, block, j.element.code(), static_cast<std::int64_t>(j.op));
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ialltoall(direct ? in : packed, static_cast<int>(block), type, rows, static_cast<int>(block), type, data,
                      &request),
        "MPI_Ialltoall (reduce-scatter)", j.what);
  if (packed != nullptr) {
    wait_keeping(request, j.what, payload[0].bytes, payload[1].bytes);
  } else {
    wait_keeping(request, j.what, payload[0].bytes);
  }
  fold_rows(rows, block * bytes, mine, j.element, j.op, "MPI_Reduce_local (reduce-scatter)", j.what);
  keep_ranges(j, rows, true);
}

void group::impl::keep_ranges(const job& j, const unsigned char* from, bool packed) const {
  const std::size_t bytes = j.element.bytes;
  auto* out = static_cast<unsigned char*>(j.out);
  std::size_t pos = 0, k = 0;
  visit_cut(j, w, [&](std::size_t at, std::size_t count) {
    unsigned char* const to = j.out_leaves != nullptr ? static_cast<unsigned char*>(j.out_leaves[k]) : out + pos;
    if (count != 0) std::memmove(to, packed ? from + pos : from + at * bytes, count * bytes);
    pos += count * bytes;
    ++k;
  });
}

std::size_t group::impl::pack_cut(const job& j, int p, unsigned char* to) const {
  const std::size_t bytes = j.element.bytes;
  std::size_t pos = 0;
  visit_cut(j, p, [&](std::size_t at, std::size_t count) {
    copy_input(j, at, count, to + pos);
    pos += count * bytes;
  });
  return pos;
}

void group::impl::exchange_slot(agreement_slot& slot, bool carried, detail::element_kind kind, ReduceOp op,
                                const char* what) {
  op = op == ReduceOp::mean ? ReduceOp::sum : op;
  log_post(post_agreement, carried ? 1 : 0, carried ? kind.code() : 0, static_cast<std::int64_t>(op));
  // On the heap, and kept if the exchange is given up on (keep_until_exit says why).
  const bool direct = W <= direct_agreement;
  unsigned char* const rows = rows_for_exchange();
  std::memcpy(rows + (direct ? static_cast<std::size_t>(w) * direct_row_bytes : 0), &slot, sizeof slot);
  std::array<MPI_Request, 2 * (direct_agreement_max - 1)> requests;
  const int n = post_slots(rows, sizeof slot, carried, kind, op, requests.data(), what);
  wait_keeping(std::span<MPI_Request>(requests.data(), static_cast<std::size_t>(n)), what, exchange_rows);
  std::memcpy(&slot, rows, sizeof slot);
  if (!direct) return;
  // Direct: every worker folds the same slots in the same order, the same bits everywhere. Each
  // message is at least a slot (a wide one too: its keys are then unequal to this one's).
  const slot_combiner combine = agreement_combiner(carried, kind, op);
  for (int p = 1; p < W; ++p) {
    agreement_slot next;
    std::memcpy(&next, rows + static_cast<std::size_t>(p) * direct_row_bytes, sizeof next);
    combine(next, slot);
  }
}

bool group::impl::exchange_direct(std::int64_t key, std::size_t bytes, detail::element_kind kind, ReduceOp op,
                                  const char* what) {
  log_post(post_agreement, 1, kind.code(), static_cast<std::int64_t>(op));
  unsigned char* const rows = rows_for_exchange();
  const std::int64_t keys[2] = {key, -key};
  unsigned char* const mine = rows + static_cast<std::size_t>(w) * direct_row_bytes;
  std::memcpy(mine, keys, sizeof keys);
  // At least a slot's length: a worker making a slot's check reads that much of every message.
  const std::size_t length = std::max(sizeof keys + bytes, sizeof(agreement_slot));
  std::memset(mine + sizeof keys + bytes, 0, length - sizeof keys - bytes);
  std::array<MPI_Request, 2 * (direct_agreement_max - 1)> requests;
  const int n = post_slots(rows, length, true, kind, op, requests.data(), what);
  wait_keeping(std::span<MPI_Request>(requests.data(), static_cast<std::size_t>(n)), what, exchange_rows);
  return keys_agree(rows, key);
}

bool group::impl::keys_agree(const unsigned char* rows, std::int64_t key) const noexcept {
  // The keys as a slot's (MAX of each); every message, of any length, starts with its keys.
  std::int64_t agreed[2] = {key, -key};
  for (int p = 0; p < W; ++p) {
    std::int64_t theirs[2];
    std::memcpy(theirs, rows + static_cast<std::size_t>(p) * direct_row_bytes, sizeof theirs);
    agreed[0] = std::max(agreed[0], theirs[0]);
    agreed[1] = std::max(agreed[1], theirs[1]);
  }
  return agreed[0] == -agreed[1];
}

bool group::impl::exchange_cuts(job& j, std::int64_t key) {
  const ReduceOp op = j.op == ReduceOp::mean ? ReduceOp::sum : j.op;
  const std::size_t bytes = j.element.bytes;
  unsigned char* const rows = rows_for_exchange();
  unsigned char* const outbox = rows + exchange_bytes();
  const std::int64_t keys[2] = {key, -key};
  // Worker p's message in the outbox's row p; this worker's own cut straight into its row w of
  // the rows the others' arrive in.
  const auto message = [&](int p) {
    return (p == w ? rows : outbox) + static_cast<std::size_t>(p) * direct_row_bytes;
  };
  std::array<std::size_t, direct_agreement_max> filled{};
  std::size_t length = sizeof(agreement_slot);  // at least a slot's (exchange_direct says why)
  for (int p = 0; p < W; ++p) {
    unsigned char* const to = message(p);
    std::memcpy(to, keys, sizeof keys);
    const std::size_t filled_to = direct_header_bytes + pack_cut(j, p, to + direct_header_bytes);
    filled[static_cast<std::size_t>(p)] = filled_to;
    length = std::max(length, filled_to);
  }
  // One length for every message (the largest cut's: post_blocks sends one), the rest zeros, so
  // that no uninitialised byte goes out.
  for (int p = 0; p < W; ++p) {
    std::memset(message(p) + filled[static_cast<std::size_t>(p)], 0, length - filled[static_cast<std::size_t>(p)]);
  }
  log_post(post_agreement, 1, j.element.code(), static_cast<std::int64_t>(op));
  std::array<MPI_Request, 2 * (direct_agreement_max - 1)> requests;
  const int n = post_blocks(rows, outbox, length, tag_agreement, requests.data(), j.what, direct_row_bytes,
                            direct_row_bytes);
  wait_keeping(std::span<MPI_Request>(requests.data(), static_cast<std::size_t>(n)), j.what, exchange_rows);
  if (!keys_agree(rows, key)) return false;
  const std::size_t mine = (filled[static_cast<std::size_t>(w)] - direct_header_bytes) / bytes;
  fold_rows(rows + direct_header_bytes, direct_row_bytes, mine, j.element, op, "MPI_Reduce_local (agreement check)",
            j.what);
  return true;
}

void group::impl::gather_cuts(job& j) {
  const std::size_t bytes = j.element.bytes;
  unsigned char* const rows = exchange_rows.get();
  unsigned char* const outbox = rows + exchange_bytes();
  auto* out = static_cast<unsigned char*>(j.data);
  // Every message the largest cut's length (cut 0's), from row 0, where the fold left this
  // worker's cut: what a worker that posts its match in a recovery sends (post_gather_messages).
  const std::size_t block = backend::cut_of(j.count, W, 0).second * bytes;
  log_post(post_gather_messages, block, 0, 0);
  std::array<MPI_Request, 2 * (direct_agreement_max - 1)> requests;
  const int n = post_blocks(outbox, rows + direct_header_bytes, block, tag_gather, requests.data(), j.what,
                            direct_row_bytes);
  const auto [first, count] = backend::cut_of(j.count, W, w);
  if (count != 0) std::memcpy(out + first * bytes, rows + direct_header_bytes, count * bytes);
  wait_keeping(std::span<MPI_Request>(requests.data(), static_cast<std::size_t>(n)), j.what, exchange_rows);
  for (int p = 0; p < W; ++p) {
    if (p == w) continue;
    const auto [at, theirs] = backend::cut_of(j.count, W, p);
    if (theirs != 0) std::memcpy(out + at * bytes, outbox + static_cast<std::size_t>(p) * direct_row_bytes, theirs * bytes);
  }
}

bool group::impl::exchange_wide(job& j, std::int64_t key) {
  const ReduceOp op = j.op == ReduceOp::mean ? ReduceOp::sum : j.op;
  unsigned char* const rows = rows_for_exchange();
  std::memcpy(rows + static_cast<std::size_t>(w) * direct_row_bytes + direct_header_bytes, j.data,
              j.count * j.element.bytes);
  if (!exchange_direct(key, j.count * j.element.bytes, j.element, op, j.what)) return false;
  // As the slots fold. (Rows start 16-byte aligned: MPI's ops read whole elements.)
  fold_rows(rows + direct_header_bytes, direct_row_bytes, j.count, j.element, op, "MPI_Reduce_local (agreement check)",
            j.what);
  return true;
}

bool group::impl::exchange_counts_direct(job& j, std::int64_t key) {
  // This worker's words, its block's length (none_carried where it offered none or it does not
  // fit), then the block.
  constexpr auto none_carried = static_cast<std::size_t>(-1);
  const std::size_t words_bytes = (j.count + 1) * sizeof(std::int64_t);
  const bool offered = j.block_bytes != detail::worker_group::no_block;
  const bool fits = offered && j.block_bytes <= detail::worker_group::carried_block_max &&
                    direct_header_bytes + words_bytes + j.block_bytes <= direct_row_bytes;
  unsigned char* const rows = rows_for_exchange();
  unsigned char* const mine = rows + static_cast<std::size_t>(w) * direct_row_bytes + direct_header_bytes;
  const auto* words = static_cast<const std::size_t*>(j.data);
  for (std::size_t i = 0; i < j.count; ++i) {
    const auto word = static_cast<std::int64_t>(words[i]);
    std::memcpy(mine + i * sizeof word, &word, sizeof word);
  }
  const auto length = static_cast<std::int64_t>(fits ? j.block_bytes : none_carried);
  std::memcpy(mine + j.count * sizeof length, &length, sizeof length);
  if (fits && j.block_bytes != 0) std::memcpy(mine + words_bytes, j.block, j.block_bytes);
  if (!exchange_direct(key, words_bytes + (fits ? j.block_bytes : 0), int64_kind, ReduceOp::sum, j.what)) return false;
  auto* all = static_cast<std::size_t*>(j.out);
  const std::size_t Wn = static_cast<std::size_t>(W);
  bool every_block = offered;
  counts_blocks.at.assign(Wn, 0);
  counts_blocks.room.assign(Wn, 0);
  std::size_t total = 0;
  for (std::size_t p = 0; p < Wn; ++p) {
    const unsigned char* const theirs = rows + p * direct_row_bytes + direct_header_bytes;
    for (std::size_t i = 0; i < j.count; ++i) {
      std::int64_t word = 0;
      std::memcpy(&word, theirs + i * sizeof word, sizeof word);
      all[p * j.count + i] = static_cast<std::size_t>(word);
    }
    std::int64_t theirs_length = 0;
    std::memcpy(&theirs_length, theirs + j.count * sizeof theirs_length, sizeof theirs_length);
    // (A length past the row is none: every worker reads the same rows, so all decide alike.)
    auto block_length = static_cast<std::size_t>(theirs_length);
    if (block_length > direct_row_bytes - direct_header_bytes - words_bytes) block_length = none_carried;
    every_block = every_block && block_length != none_carried;
    if (block_length != none_carried) counts_blocks.room[p] = block_length;
    counts_blocks.at[p] = total;
    total += counts_blocks.room[p];
  }
  if (every_block) {
    counts_blocks.bytes.resize(total);
    for (std::size_t p = 0; p < Wn; ++p) {
      if (counts_blocks.room[p] == 0) continue;
      std::memcpy(counts_blocks.bytes.data() + counts_blocks.at[p],
                  rows + p * direct_row_bytes + direct_header_bytes + words_bytes, counts_blocks.room[p]);
    }
    counts_blocks.valid = true;
  }
  return true;
}

int group::impl::post_slots(unsigned char* rows, std::size_t bytes, bool carried, detail::element_kind kind,
                            ReduceOp op, MPI_Request* requests, const char* what) {
  if (W <= direct_agreement) {
    return post_blocks(rows, rows + static_cast<std::size_t>(w) * direct_row_bytes, bytes, tag_agreement, requests,
                       what, direct_row_bytes);
  }
  check(MPI_Iallreduce(MPI_IN_PLACE, rows, 1, agreement_type(), agreement_op(carried, kind, op), data, &requests[0]),
        "MPI_Iallreduce (agreement check)", what);
  return 1;
}

bool group::impl::carries(const job& j) const noexcept {
  // An all-gather of counts: in direct messages, each worker's words in its own message; in a
  // slot, a sum of the workers' blocks of words, each zero but its owner's.
  if (j.kind == job::counts) {
    if (W <= direct_agreement) return j.count != 0 && direct_header_bytes + (j.count + 1) * sizeof(std::int64_t) <= direct_row_bytes;
    return j.count != 0 && j.count * static_cast<std::size_t>(W) * sizeof(std::int64_t) <= slot_payload_bytes;
  }
  if (j.kind != job::reduce && j.kind != job::scatter) return false;
  if (carries_cuts(j)) return true;
  const std::size_t room = W <= direct_agreement ? wide_carry_max : slot_payload_bytes;
  if (j.count == 0 || j.count * j.element.bytes > room || datatype_of(j.element) == MPI_BYTE) return false;
  // A direct check folds in worker order; MPI_Iallreduce in its own, which two operands share.
  return !j.in_worker_order || W <= direct_agreement || W == 2;
}

bool group::impl::carries_cuts(const job& j) const noexcept {
  if (j.kind == job::reduce) return reduction_in_cuts(j.count, j.element);
  if (j.kind != job::scatter || !beyond_wide(j.count, j.element) || !scatter_by_worker(j)) return false;
  std::size_t largest = 0;
  for (int p = 0; p < W; ++p) largest = std::max(largest, visit_cut(j, p, [](std::size_t, std::size_t) {}));
  return largest * j.element.bytes <= wide_carry_max;
}

int group::impl::post_blocks(void* rows, const void* mine, std::size_t block, int tag, MPI_Request* requests,
                             const char* what, std::size_t capacity, std::size_t send_stride) {
  if (capacity == 0) capacity = block;
  int n = 0;
  for (int p = 0; p < W; ++p) {
    if (p == w) continue;
    check(MPI_Irecv(static_cast<unsigned char*>(rows) + static_cast<std::size_t>(p) * capacity,
                    static_cast<int>(capacity), MPI_BYTE, p, tag, data, &requests[n++]),
          "MPI_Irecv", what);
  }
  for (int p = 0; p < W; ++p) {
    if (p == w) continue;
    check(MPI_Isend(static_cast<const unsigned char*>(mine) + static_cast<std::size_t>(p) * send_stride,
                    static_cast<int>(block), MPI_BYTE, p, tag, data, &requests[n++]),
          "MPI_Isend", what);
  }
  return n;
}

void group::impl::gather(job& j) {
  const std::size_t K = j.num_sizes, bytes = j.element.bytes, Wn = static_cast<std::size_t>(W);
  const std::size_t* counts = j.sizes;
  std::vector<std::size_t> per(Wn, 0);
  for (std::size_t p = 0; p < Wn; ++p) {
    for (std::size_t k = 0; k < K; ++k) per[p] += counts[p * K + k] * bytes;
  }
  const std::size_t block = *std::max_element(per.begin(), per.end());
  if (block == 0) return sync(j);  // nothing anywhere (every worker has the same counts)
  if (block > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(detail::format("%s: %zu bytes per worker in one cross-worker all-gather exceed MPI's "
                                               "int count; split the leaf",
                                               j.what, block)
                                    .c_str());
  }
  // Where worker p's block of leaf k starts in leaf k: after the blocks of workers 0..p-1.
  std::vector<std::size_t> at(Wn * K, 0);
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t p = 1; p < Wn; ++p) at[p * K + k] = at[(p - 1) * K + k] + counts[(p - 1) * K + k] * bytes;
  }
  // Where this worker's part of leaf k is: in place, or at j.own[k] (then copied in: own_in()).
  const auto own_of = [&](std::size_t k) -> const unsigned char* {
    return j.own != nullptr ? static_cast<const unsigned char*>(j.own[k])
                            : static_cast<unsigned char*>(j.leaves[k]) + at[static_cast<std::size_t>(w) * K + k];
  };
  const auto own_in = [&] {
    for (std::size_t k = 0; j.own != nullptr && k < K; ++k) {
      const std::size_t n = counts[static_cast<std::size_t>(w) * K + k] * bytes;
      if (n != 0) std::memcpy(static_cast<unsigned char*>(j.leaves[k]) + at[static_cast<std::size_t>(w) * K + k], j.own[k], n);
    }
  };
  // This worker's block, packed into `into`; and every other worker's, from its block in `rows`.
  const auto pack = [&](unsigned char* into) {
    std::size_t pos = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const std::size_t n = counts[static_cast<std::size_t>(w) * K + k] * bytes;
      if (n != 0) std::memcpy(into + pos, own_of(k), n);
      pos += n;
    }
  };
  const auto unpack = [&](const unsigned char* rows) {
    for (std::size_t p = 0; p < Wn; ++p) {
      if (p == static_cast<std::size_t>(w)) continue;
      std::size_t pos = p * block;
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t n = counts[p * K + k] * bytes;
        if (n != 0) std::memcpy(static_cast<unsigned char*>(j.leaves[k]) + at[p * K + k], rows + pos, n);
        pos += n;
      }
    }
  };
  // Small: the blocks travel as a sum in one round of messages (each worker's block, zeros
  // elsewhere), without a libnbc schedule.
  if (Wn * block <= slot_payload_bytes && W <= direct_agreement) {
    agreement_slot slot{};
    pack(slot.payload + static_cast<std::size_t>(w) * block);
    exchange_slot(slot, true, detail::element_kind{detail::element_kind::category::unsigned_integer, 1}, ReduceOp::sum,
                  j.what);
    unpack(slot.payload);
    own_in();
    return;
  }
  const bool equal = std::all_of(per.begin(), per.end(), [&](std::size_t c) { return c == block; });
  // One leaf of equal blocks among few workers: each worker's block straight from where it is
  // to every other worker, one round of messages, while this worker copies its own into place.
  // MPI then reads the replica's input, not an output the other core has just written, which
  // is slower to read (and libnbc's MPI_Iallgather from the input copies it first itself).
  if (K == 1 && equal && W <= direct_agreement) {
    log_post(post_gather_messages, block, 0, 0);
    std::array<MPI_Request, 2 * (direct_agreement_max - 1)> requests;
    const int n = post_blocks(j.leaves[0], own_of(0), block, tag_gather, requests.data(), j.what);
    own_in();
    wait(std::span<MPI_Request>(requests.data(), static_cast<std::size_t>(n)), j.what);
    return;
  }
  own_in();
  MPI_Request request = MPI_REQUEST_NULL;
  if (K == 1 && equal) {
    log_post(post_allgather_bytes, block, 0, 1);
    check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.leaves[0], static_cast<int>(block), MPI_BYTE, data,
                         &request),
          "MPI_Iallgather (all-gather)", j.what);
    wait(request, j.what);
    return;
  }
  // Kept from job to job, and given up with the exchange if it is (keep_until_exit says why).
  unsigned char* const send = payload[1].at_least(block);
  unsigned char* const recv = payload[0].at_least(Wn * block);
  pack(send);
  log_post(post_allgather_bytes, block, 0, 0);
  check(MPI_Iallgather(send, static_cast<int>(block), MPI_BYTE, recv, static_cast<int>(block), MPI_BYTE, data,
                       &request),
        "MPI_Iallgather (all-gather)", j.what);
  wait_keeping(request, j.what, payload[1].bytes, payload[0].bytes);
  unpack(recv);
}

void group::impl::gather_counts(job& j) {
  const std::size_t n = j.count, Wn = static_cast<std::size_t>(W);
  // On the heap, and kept if the exchange is given up on (keep_until_exit says why).
  auto words = std::make_unique<std::int64_t[]>(std::max<std::size_t>(1, n + n * Wn));
  const auto* mine = static_cast<const std::size_t*>(j.data);
  for (std::size_t i = 0; i < n; ++i) words[i] = static_cast<std::int64_t>(mine[i]);
  log_post(post_allgather_words, n, int64_kind.code(), 0);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(words.get(), static_cast<int>(n), MPI_INT64_T, words.get() + n, static_cast<int>(n),
                       MPI_INT64_T, data, &request),
        "MPI_Iallgather (counts)", j.what);
  wait_keeping(request, j.what, words);
  auto* all = static_cast<std::size_t*>(j.out);
  for (std::size_t i = 0; i < n * Wn; ++i) all[i] = static_cast<std::size_t>(words[n + i]);
}

bool group::impl::take_carried_blocks(void* leaf, const std::size_t* counts, std::size_t element_bytes,
                                      const void* const* own) {
  if (!counts_blocks.valid) return false;
  counts_blocks.valid = false;
  const std::size_t Wn = static_cast<std::size_t>(W);
  for (std::size_t p = 0; p < Wn; ++p) {
    if (counts[p] * element_bytes > counts_blocks.room[p]) return false;  // that worker's did not fit: it was not sent
  }
  auto* out = static_cast<unsigned char*>(leaf);
  for (std::size_t p = 0; p < Wn; ++p) {
    const std::size_t n = counts[p] * element_bytes;
    if (n != 0 && p != static_cast<std::size_t>(w)) std::memcpy(out, counts_blocks.bytes.data() + counts_blocks.at[p], n);
    if (n != 0 && p == static_cast<std::size_t>(w) && own != nullptr) std::memcpy(out, own[0], n);
    out += n;
  }
  return true;
}

void group::impl::agree(job& j, bool carried, bool keyed) {
  // What the collective is, in one number: an op in worker order is another collective (an
  // all-to-all and an all-gather): +100; a reduce-scatter +200; a broadcast 1000 + its root.
  std::uint64_t what_kind = 0, element = static_cast<std::uint64_t>(j.element.cat) << 8 | j.element.bytes;
  std::int64_t flag = 0;  // how the message describes it
  switch (j.checks_broadcast ? job::bcast : j.kind) {
    case job::bcast: what_kind = 1000 + static_cast<std::uint64_t>(j.root), element = 0, flag = 1; break;
    case job::scatter: what_kind = 200 + static_cast<std::uint64_t>(j.op) + (j.in_worker_order ? 100 : 0), flag = 2; break;
    case job::gather: what_kind = 500, flag = 3; break;
    case job::counts: what_kind = 600, element = 0, flag = 4; break;
    default: what_kind = static_cast<std::uint64_t>(j.op) + (j.in_worker_order ? 100 : 0); break;
  }
  const std::uint64_t call = detail::pack_call(j.position.kind, j.position.param);
  // Zero where no check is made: every worker's keys are then equal.
  std::int64_t key = 0;
  if (keyed) {
    key = agreement_key(j.count, element, what_kind);
    key = agreement_key(static_cast<std::uint64_t>(key), j.position.sequence, call);
    // And the run: the phase (odd inside a run, even between runs) tells a worker still in run n
    // from one that returned from it and is in run n + 1 at the same collective number.
    key = agreement_key(static_cast<std::uint64_t>(key), detail::text_hash(j.what), static_cast<std::uint64_t>(j.phase));
    if (j.sizes != nullptr) {
      // Each leaf's size (or each worker's count of each leaf) must agree too, not only the sum.
      const std::size_t n = j.kind == job::gather ? j.num_sizes * static_cast<std::size_t>(W) : j.num_sizes;
      key = agreement_key(static_cast<std::uint64_t>(key), detail::shape_hash(j.sizes, n), j.num_sizes);
    }
    // A broadcast's element types: its sizes count elements, and an empty one moves no bytes.
    if (j.nest_hash != 0) key = agreement_key(static_cast<std::uint64_t>(key), j.nest_hash, 1);
  }
  if (carried && j.kind == job::counts && W <= direct_agreement) {
    if (!exchange_counts_direct(j, key)) describe_disagreement(j, element, what_kind, flag, call);
    return;
  }
  if (carried && carries_cuts(j)) {
    if (exchange_cuts(j, key)) {
      if (j.kind == job::scatter) {
        keep_ranges(j, exchange_rows.get() + direct_header_bytes, true);
      } else {
        gather_cuts(j);
      }
      return;
    }
    describe_disagreement(j, element, what_kind, flag, call);
  }
  if (carried && carries_wide(j)) {
    if (exchange_wide(j, key)) {
      const unsigned char* const result = exchange_rows.get() + direct_header_bytes;
      if (j.kind == job::scatter) {
        keep_ranges(j, result);
      } else {
        std::memcpy(j.data, result, j.count * j.element.bytes);
      }
      return;
    }
    describe_disagreement(j, element, what_kind, flag, call);
  }
  // The elements of a carried reduction (a counts job: this worker's words in its block), then
  // zeros: every worker's slot holds the same bytes where unused.
  agreement_slot own;
  own.key[0] = key;
  own.key[1] = -key;
  std::memset(own.payload, 0, slot_payload_bytes);
  const std::size_t carried_bytes = carried ? j.count * j.element.bytes : 0;
  // A counts job's words, then, after every worker's, this worker's all-gather block where it
  // fits its share of the rest (every worker's share at the same place on every worker).
  const std::size_t blocks_at = static_cast<std::size_t>(W) * j.count * sizeof(std::int64_t);
  const std::size_t region = carried && j.kind == job::counts ? block_region(j.count) : 0;
  if (carried && j.kind == job::counts) {
    const auto* words = static_cast<const std::size_t*>(j.data);
    for (std::size_t i = 0; i < j.count; ++i) {
      const auto word = static_cast<std::int64_t>(words[i]);
      std::memcpy(own.payload + (static_cast<std::size_t>(w) * j.count + i) * sizeof word, &word, sizeof word);
    }
    if (j.block_bytes != 0 && j.block_bytes <= region) {
      std::memcpy(own.payload + blocks_at + static_cast<std::size_t>(w) * region, j.block, j.block_bytes);
    }
  } else if (carried_bytes != 0) {
    std::memcpy(own.payload, j.data, carried_bytes);
  }
  exchange_slot(own, carried, j.element, j.op, j.what);
  if (own.key[0] == -own.key[1]) {
    if (carried && j.kind == job::scatter) {
      keep_ranges(j, own.payload);
    } else if (carried && j.kind == job::counts) {
      auto* all = static_cast<std::size_t*>(j.out);
      for (std::size_t i = 0; i < j.count * static_cast<std::size_t>(W); ++i) {
        std::int64_t word = 0;
        std::memcpy(&word, own.payload + i * sizeof word, sizeof word);
        all[i] = static_cast<std::size_t>(word);
      }
      if (j.block_bytes != detail::worker_group::no_block && region != 0) {
        const std::size_t Wn = static_cast<std::size_t>(W);
        counts_blocks.bytes.assign(own.payload + blocks_at, own.payload + blocks_at + Wn * region);
        counts_blocks.at.resize(Wn);
        for (std::size_t p = 0; p < Wn; ++p) counts_blocks.at[p] = p * region;
        counts_blocks.room.assign(Wn, region);
        counts_blocks.valid = true;
      }
    } else if (carried_bytes != 0) {
      std::memcpy(j.data, own.payload, carried_bytes);
    }
    return;
  }
  describe_disagreement(j, element, what_kind, flag, call);
}

void group::impl::describe_disagreement(const job& j, std::uint64_t element, std::uint64_t what_kind,
                                        std::int64_t flag, std::uint64_t call) {
  MPI_Request request = MPI_REQUEST_NULL;
  // Mine, then every worker's.
  constexpr std::size_t D = description_words;
  auto gathered = std::make_unique<std::int64_t[]>(D + D * static_cast<std::size_t>(W));
  std::int64_t* const mine = gathered.get();
  const std::int64_t* const all = mine + D;
  mine[0] = static_cast<std::int64_t>(j.count);
  mine[1] = static_cast<std::int64_t>(element);
  mine[2] = static_cast<std::int64_t>(what_kind);
  mine[3] = flag | static_cast<std::int64_t>(j.num_sizes) << 8;
  mine[4] = static_cast<std::int64_t>(j.position.sequence);
  mine[5] = static_cast<std::int64_t>(call);
  mine[6] = j.phase;
  std::strncpy(reinterpret_cast<char*>(mine + 7), j.what != nullptr ? j.what : "", what_words * sizeof(std::int64_t) - 1);
  const std::string site = site_of(j, site_words * sizeof(std::int64_t));
  std::memcpy(mine + 7 + what_words, site.c_str(), site.size() + 1);
  log_post(post_allgather_words, D, int64_kind.code(), 0);
  check(MPI_Iallgather(mine, static_cast<int>(D), MPI_INT64_T, mine + D, static_cast<int>(D), MPI_INT64_T, data,
                       &request),
        "MPI_Iallgather (agreement check)", j.what);
  wait_keeping(request, j.what, gathered);
  throw_disagreement(all);
}

void group::impl::throw_disagreement(const std::int64_t* all) {
  constexpr std::size_t D = description_words;
  const auto desc = [&](int p) { return &all[D * static_cast<std::size_t>(p)]; };
  const auto replicas_of = [&](int p) {
    return detail::format("replicas %d..%d", p * R, p * R + R - 1);
  };
  // Where each worker is: what its cross-worker step moves, then the user's call.
  std::string table;
  bool described_alike = true;
  for (int p = 0; p < W; ++p) {
    const std::int64_t* d = desc(p);
    described_alike = described_alike && std::equal(d, d + 6, desc(0)) && std::equal(d + 7, d + 7 + what_words, desc(0) + 7);  // call sites may differ
    table += detail::format("%sworker %d (%s) ", p == 0 ? " " : "; ", p, replicas_of(p).c_str()).c_str();
    const detail::element_kind k = detail::element_kind::from_code(static_cast<std::uint64_t>(d[1]));
    const auto one = [](std::int64_t n) { return n == 1 ? "" : "s"; };  // "1 element", "2 elements"
    const detail::message leaves =
        detail::format(" in %lld %s", static_cast<long long>(d[3] >> 8), (d[3] >> 8) == 1 ? "leaf" : "leaves");
    const char* const order = (d[2] % 200) >= 100 ? " in worker order (MpiAllReduce{.deterministic = true})" : "";
    switch (d[3] & 0xff) {
      case 1:
        table += (d[0] != 0 ? detail::format("broadcasts %lld byte%s from worker %lld", static_cast<long long>(d[0]),
                                             one(d[0]), static_cast<long long>(d[2] - 1000))
                            : detail::format("broadcasts from worker %lld", static_cast<long long>(d[2] - 1000)))
                     .c_str();
        break;
      case 2: {
        const std::string_view op = mirror::to_string(static_cast<ReduceOp>(d[2] % 100));
        table += detail::format("reduce-scatters %lld %s element%s%s with %.*s%s", static_cast<long long>(d[0]),
                                kind_name(k).c_str(), one(d[0]), leaves.c_str(), static_cast<int>(op.size()), op.data(), order)
                     .c_str();
        break;
      }
      case 3:
        table += detail::format("all-gathers %lld byte%s of %s elements%s", static_cast<long long>(d[0]), one(d[0]),
                                kind_name(k).c_str(), leaves.c_str())
                     .c_str();
        break;
      case 4:
        table += detail::format("all-gathers %lld count%s per worker", static_cast<long long>(d[0]), one(d[0])).c_str();
        break;
      default: {
        const std::string_view op = mirror::to_string(static_cast<ReduceOp>(d[2] % 100));
        table += detail::format("reduces %lld %s element%s with %.*s%s", static_cast<long long>(d[0]),
                                kind_name(k).c_str(), one(d[0]), static_cast<int>(op.size()), op.data(), order)
                     .c_str();
      }
    }
    std::string what(reinterpret_cast<const char*>(d + 7), what_words * sizeof(std::int64_t));
    what.resize(std::strlen(what.c_str()));
    std::string site(reinterpret_cast<const char*>(d + 7 + what_words), site_words * sizeof(std::int64_t));
    site.resize(std::strlen(site.c_str()));
    if (site.empty()) site = "an unknown call site";
    const auto call_kind = detail::kind_of_call(static_cast<std::uint64_t>(d[5]));
    const auto call_param = detail::param_of_call(static_cast<std::uint64_t>(d[5]));
    if (d[4] == 0) {
      table += ", in " + what + " called outside fn at " + site;
    } else {
      table += detail::format(", at collective #%lld (%s) of fn at %s (%s)", static_cast<long long>(d[4]),
                              detail::to_string(call_kind, call_param).text, site.c_str(), what.c_str())
                   .c_str();
    }
  }
  // Phases: odd inside a run. Workers ahead of one that is inside a run have returned from that
  // run's fn without reaching the collective it waits in (a worker whose every replica
  // returned early has nobody local to notice): a timeout_error naming them, as within a worker.
  std::int64_t lowest = desc(0)[6], highest = lowest;
  for (int p = 1; p < W; ++p) {
    lowest = std::min(lowest, desc(p)[6]);
    highest = std::max(highest, desc(p)[6]);
  }
  std::vector<int> missing;
  std::string ahead, behind;
  for (int p = 0; p < W; ++p) {
    std::string& list = desc(p)[6] > lowest ? ahead : behind;
    list += detail::format("%s%d", list.empty() ? "" : ", ", p).c_str();
    if (desc(p)[6] > lowest) {
      for (int r = 0; r < R; ++r) missing.push_back(p * R + r);
    }
  }
  // Runs pair by their count. Workers at different phases: every call of the phases up to the
  // highest has lost its match (a worker ahead passed those phases, or throws its call of the
  // highest now), so each worker refuses its own calls through that phase, and the next phase
  // pairs right. Workers in the same run: the rest of it is refused too, since a worker whose fn
  // ends at this error posts nothing more in it, while another may have started later
  // collectives already (non-blocking ones, gradient buckets).
  const bool refuse = highest != lowest || (highest & 1) != 0;
  std::string refused;
  if (highest == lowest && refuse) {
    refused = detail::format("; every worker refuses its later cross-worker calls of run %lld with this error",
                             static_cast<long long>((highest + 1) / 2))
                  .c_str();
  } else if (highest != lowest) {
    refused = (highest & 1) != 0
                  ? detail::format("; every worker refuses its cross-worker calls through run %lld with this error "
                                   "(runs pair by their count, and the other workers' calls of those runs have "
                                   "failed); run %lld pairs again",
                                   static_cast<long long>((highest + 1) / 2), static_cast<long long>((highest + 1) / 2 + 1))
                        .c_str()
                  : detail::format("; every worker refuses its cross-worker calls until run %lld starts with this "
                                   "error (runs pair by their count, and the other workers' calls between runs %lld "
                                   "and %lld have failed); run %lld pairs again",
                                   static_cast<long long>(highest / 2 + 1), static_cast<long long>(highest / 2),
                                   static_cast<long long>(highest / 2 + 1), static_cast<long long>(highest / 2 + 1))
                        .c_str();
  }
  std::exception_ptr e;
  if ((lowest & 1) != 0 && !missing.empty()) {
    std::string names;
    for (const int m : missing) names += detail::format("%s%d", names.empty() ? "" : ", ", m).c_str();
    e = std::make_exception_ptr(timeout_error(
        detail::format("mirror: replicas {%s} (workers %s) returned from fn without reaching the collective that "
                       "workers %s wait in, and made a later call:%s; every replica of every worker must make the "
                       "same collective calls%s",
                       names.c_str(), ahead.c_str(), behind.c_str(), table.c_str(), refused.c_str()),
        missing));
  } else {
    std::string text = "mirror: the workers disagree on a cross-worker collective:" + table;
    if (described_alike && highest != lowest) {
      text += "; the calls are alike, but the workers stand in different runs (one made more Strategy::run calls "
              "than another)";
    } else if (described_alike) {
      text += (desc(0)[3] & 0xff) == 1 ? "; the nests' types or the sizes of individual leaves differ between the workers"
                                       : "; the sizes of individual leaves differ between the workers";
    }
    text += "; every replica of every worker must make the same collective calls, in the same order, with leaves "
            "of the same sizes";
    text += refused;
    e = std::make_exception_ptr(shape_error(text));
  }
  {
    std::lock_guard lock(mutex);
    symmetric.push_back(e);
    if (symmetric.size() > 16) symmetric.erase(symmetric.begin());
    if (refuse && highest > refused_through) {
      refused_through = highest;
      refusal = e;
    }
  }
  std::rethrow_exception(e);
}

void group::impl::log_post(post_kind kind, std::size_t count, std::int64_t element, std::int64_t op) {
  ++sequence;
  posts.push_back({sequence, kind, static_cast<std::int64_t>(count), element, op, job_phase});
  if (posts.size() > kept_posts) posts.pop_front();
}

int group::impl::post_iallreduce(void* buffer, std::size_t n, detail::element_kind kind, ReduceOp op,
                                 MPI_Request& request) {
  const bool ring = use_ring(n * kind.bytes);
  if (ring) ring_algorithm.set(1);
  const int code =
      MPI_Iallreduce(MPI_IN_PLACE, buffer, static_cast<int>(n), datatype_of(kind), op_of(op, kind), data, &request);
  if (ring) ring_algorithm.set(0);
  return code;
}

bool group::impl::use_ring(std::size_t bytes) const {
  const std::size_t ring_from = W == 2 ? two_worker_ring_threshold_bytes : ring_threshold_bytes;
  return ring_algorithm.usable && bytes >= ring_from;
}

}  // namespace mirror::mpi
