// SPDX-License-Identifier: Apache-2.0
// mirror::mpi::place_gpus (backends/mpi/gpu_placement.hpp): two rounds of MPI_Iallgather of
// fixed-size records, each waited for with the strategy's timeout, on the user's thread before
// the worker's group (and its communication thread) exists.

#include <mirror/backends/mpi/gpu_placement.hpp>
#include <mirror/backends/mpi/group/impl.hpp>

namespace mirror::mpi {
namespace {

constexpr std::size_t name_bytes = 256, max_claimed = 16, bus_bytes = 32;

struct host_record {
  char host[name_bytes];
  char hostid[name_bytes];
};
struct claim_record {
  int visible;
  int count;  // bus ids listed (the first max_claimed GPUs)
  char bus[max_claimed][bus_bytes];
};

void copy_text(char* to, std::size_t room, const std::string& from) {
  std::memset(to, 0, room);
  std::memcpy(to, from.data(), std::min(from.size(), room - 1));
}

// Every worker's `mine`, in rank order; waited for until `deadline`.
template <class T>
std::vector<T> all_of(const T& mine, MPI_Comm comm, clock::time_point deadline, std::chrono::milliseconds timeout,
                      const char* call) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  // On the heap, and kept if the wait gives up: MPI writes into it whenever the gather completes.
  auto in = std::make_unique<T[]>(1);
  auto out = std::make_unique<T[]>(static_cast<std::size_t>(size));
  in[0] = mine;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(in.get(), sizeof(T), MPI_BYTE, out.get(), sizeof(T), MPI_BYTE, comm, &request), call);
  try {
    wait_for_everyone(request, deadline, timeout, comm, call);
  } catch (...) {
    keep_until_exit(in);
    keep_until_exit(out);
    throw;
  }
  return std::vector<T>(out.get(), out.get() + size);
}

}  // namespace

std::vector<int> place_gpus(const communicator& c, std::chrono::milliseconds timeout, std::span<const int> requested,
                            std::span<const std::string> visible_bus_ids, bool shared_gpus_allowed, int nccl_version) {
  initialize_mpi();
  const MPI_Comm comm = c.is_world() ? MPI_COMM_WORLD : c.get<MPI_Comm>();
  const auto deadline = clock::now() + timeout;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);

  host_record me{};
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  check(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  copy_text(me.host, name_bytes, std::string(name, static_cast<std::size_t>(length)));
  const char* hostid = std::getenv("NCCL_HOSTID");
  copy_text(me.hostid, name_bytes, hostid != nullptr ? hostid : "");
  const auto hosts = all_of(me, comm, deadline, timeout, "MPI_Iallgather (host names, GPU placement)");
  std::vector<std::string> names;
  for (const host_record& h : hosts) names.emplace_back(h.host);

  const int visible = static_cast<int>(visible_bus_ids.size());
  std::vector<int> gpus(requested.begin(), requested.end());
  if (gpus.empty() && visible > 0) gpus.push_back(host_rank(names, rank) % visible);
  claim_record claim{};
  claim.visible = visible;
  for (const int g : gpus) {
    if (g < 0 || g >= visible || static_cast<std::size_t>(claim.count) == max_claimed) continue;  // the runtime names a bad ordinal
    copy_text(claim.bus[claim.count++], bus_bytes, visible_bus_ids[static_cast<std::size_t>(g)]);
  }
  const auto claims = all_of(claim, comm, deadline, timeout, "MPI_Iallgather (GPU claims)");
  std::vector<gpu_claim> all;
  for (std::size_t w = 0; w < claims.size(); ++w) {
    gpu_claim g{hosts[w].host, hosts[w].hostid, {}, claims[w].visible};
    for (int k = 0; k < claims[w].count; ++k) g.bus_ids.emplace_back(claims[w].bus[k]);
    all.push_back(std::move(g));
  }
  if (std::string why = gpu_conflict(all, shared_gpus_allowed, nccl_version); !why.empty()) {
    throw std::invalid_argument(why);
  }
  return gpus;
}

}  // namespace mirror::mpi
