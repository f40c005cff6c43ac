#include "host_hierarchy.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "../common/logging.h"

namespace horovodlike {
namespace {

// What each rank tells every other: the lowest job rank of its host group, and whether its
// HOROVOD_HIERARCHICAL_ALLREDUCE and HOROVOD_HIERARCHICAL_ALLGATHER are set. Every rank must take
// the same path, so a collective goes by host only when all ranks ask for it.
struct HostReport {
  int32_t leader;
  int32_t wanted_allreduce;
  int32_t wanted_allgather;
};

std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

// Whether every rank asked for the collective `what`; if this rank did and others did not, says
// which and how to set it for the whole job.
bool EveryRankWants(const std::vector<HostReport>& reports, int32_t HostReport::*wanted,
                    int me, const char* variable, const char* flag, const char* what) {
  std::vector<int> without;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!(reports[r].*wanted)) without.push_back(static_cast<int>(r));
  }
  if (without.empty()) return true;
  if (reports[me].*wanted) {
    HVDL_LOG(kWarning, variable << " is set on this rank but not on rank"
                                << (without.size() == 1 ? " " : "s ") << RankList(without)
                                << "; every rank uses the flat " << what
                                << ". Set it for the whole job (horovodlikerun " << flag << ")");
  }
  return false;
}

}  // namespace

std::unique_ptr<HostHierarchy> HostHierarchy::Build(Link& tcp, ShmLink* local,
                                                    Wanted wanted) {
  const int size = tcp.size(), me = tcp.rank();
  const std::vector<int> mine = local != nullptr ? local->members() : std::vector<int>{me};

  std::vector<HostReport> reports(size);
  reports[me] = {static_cast<int32_t>(mine.front()), wanted.allreduce ? 1 : 0,
                 wanted.allgather ? 1 : 0};
  for (int peer = 0; peer < size; ++peer) {
    if (peer != me) tcp.send(peer, &reports[me], sizeof(HostReport));
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer != me) tcp.recv(peer, &reports[peer], sizeof(HostReport));
  }

  // Hosts keyed by their lowest rank; each rank's leader must be a rank that leads itself.
  std::map<int, std::vector<int>> hosts;
  for (int r = 0; r < size; ++r) {
    const int leader = reports[r].leader;
    if (leader < 0 || leader > r || reports[leader].leader != leader) {
      throw TransportError("rank " + std::to_string(r) + " reported host leader " +
                           std::to_string(leader) + ", which does not lead a host group", r);
    }
    hosts[leader].push_back(r);
  }
  if (hosts.at(mine.front()) != mine) {
    throw TransportError("the ranks disagree on which ranks share this host: shared memory "
                         "joins ranks " + RankList(mine) + ", the others report ranks " +
                         RankList(hosts.at(mine.front())));
  }

  const bool allreduce =
      EveryRankWants(reports, &HostReport::wanted_allreduce, me, "HOROVOD_HIERARCHICAL_ALLREDUCE",
                     "--hierarchical-allreduce", "allreduce");
  const bool allgather =
      EveryRankWants(reports, &HostReport::wanted_allgather, me, "HOROVOD_HIERARCHICAL_ALLGATHER",
                     "--hierarchical-allgather", "allgather");
  if (!allreduce && !allgather) return nullptr;

  size_t largest = 0, smallest = static_cast<size_t>(size);
  for (const auto& [leader, members] : hosts) {
    largest = std::max(largest, members.size());
    smallest = std::min(smallest, members.size());
  }
  const int host_count = static_cast<int>(hosts.size());
  if (host_count == 1 || largest == 1) {
    HVDL_LOG(kDebug, "hierarchical collectives: " << host_count << " host(s) with at most "
                     << largest << " rank(s) each; the flat ones serve as well");
    return nullptr;
  }

  const bool uniform = largest == smallest;
  const int local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), me) - mine.begin());
  std::vector<int> cross;
  if (uniform || local_rank == 0) {
    for (const auto& [leader, members] : hosts) cross.push_back(members[local_rank]);
    std::sort(cross.begin(), cross.end());
  }
  HVDL_LOG(kDebug, "hierarchical collectives over " << host_count << " hosts ("
                   << (uniform ? "equal" : "uneven") << "), " << mine.size()
                   << " rank(s) on this one; across hosts with ranks " << RankList(cross));
  std::unique_ptr<HostHierarchy> hierarchy(new HostHierarchy());
  hierarchy->local_ = local;
  if (!cross.empty()) hierarchy->cross_ = std::make_unique<SubsetLink>(tcp, cross);
  hierarchy->uniform_ = uniform;
  hierarchy->hosts_ = host_count;
  hierarchy->allreduce_ = allreduce;
  hierarchy->allgather_ = allgather;
  hierarchy->local_rank_ = local_rank;
  int expected = 0;
  for (const auto& [leader, members] : hosts) {
    if (leader == mine.front()) {
      hierarchy->host_index_ = static_cast<int>(hierarchy->host_ranks_.size());
    }
    hierarchy->host_ranks_.push_back(members);
    for (int r : members) hierarchy->contiguous_ &= r == expected++;
  }
  return hierarchy;
}

}  // namespace horovodlike
