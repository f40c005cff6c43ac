#include "controller.h"

#include <algorithm>
#include <functional>
#include <iomanip>
#include <iterator>
#include <sstream>

#include "fusion_buffer.h"
#include "handle_table.h"
#include "response_builder.h"
#include "../common/logging.h"
#include "../collectives/star_exchange.h"

namespace horovodlike {
namespace {

constexpr uint64_t kFlagNoUncached = 1;  // set: this rank has no uncached work
constexpr uint64_t kFlagNoShutdown = 2;  // set: this rank is not shutting down
constexpr uint64_t kFlagNoStallCheck = 4;  // cleared by the coordinator: stall reports this round

// The request a rank would have made for a tensor it did not submit (a joined rank).
Request RequestFromResponse(const Response& r) {
  Request q;
  q.op = static_cast<OpType>(r.type);
  q.name = r.names.at(0);
  q.dtype = r.dtype;
  q.shape = r.shape;
  q.reduce_op = r.reduce_op;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.root_rank = r.root_rank;
  q.device = r.device;
  return q;
}

}  // namespace

Controller::Controller(Link& link, const Config& config, bool carries_parameters)
    : link_(link), config_(config), cache_(config.cache_capacity),
      carries_parameters_(carries_parameters),
      stall_inspector_(config) {
  parameters_.fusion_threshold_bytes = config.fusion_threshold_bytes;
  parameters_.cycle_time_ms = config.cycle_time_ms;
  parameters_.cache_enabled = config.cache_capacity > 0;
  proposal_ = parameters_;
}

void Controller::ApplyCacheSetting() {
  if (parameters_.cache_enabled == cache_active_) return;
  if (!parameters_.cache_enabled) {
    for (int slot = 0; slot < cache_.num_slots(); ++slot) ToUncached(slot);
  }
  cache_.SetActive(parameters_.cache_enabled);
  cache_changed_ = true;
  cache_active_ = parameters_.cache_enabled;
}

void Controller::SetCachedReady(int slot) {
  const size_t word = static_cast<size_t>(slot) / 64;
  if (word >= cached_ready_.size()) cached_ready_.resize(word + 1, 0);
  cached_ready_[word] |= 1ULL << (slot % 64);
  if (static_cast<size_t>(slot) >= cached_since_.size()) cached_since_.resize(slot + 1);
  cached_since_[slot] = std::chrono::steady_clock::now();
}

bool Controller::ClearCachedReady(int slot) {
  if (!IsCachedReady(slot)) return false;
  cached_ready_[slot / 64] &= ~(1ULL << (slot % 64));
  return true;
}

void Controller::ToUncached(int slot) {
  if (!ClearCachedReady(slot)) return;
  // A hit has the cached request's parameters: that is this rank's request.
  Request request = cache_.request(slot);
  request.rank = link_.rank();
  local_[request.name] = request;
  uncached_.push_back(std::move(request));
}

void Controller::CommitPreviousRound() {
  for (int slot : ready_slots_) cache_.Touch(slot);
  ready_slots_.clear();
  // Every rank puts the same responses in the same order, whether or not it had the tensor
  // itself (a joined rank does not).
  if (!decided_.empty()) cache_changed_ = true;
  for (const Response& response : decided_) {
    if (response.type == Response::Type::kJoin) joined_ = false;
    const std::string& name = response.names.at(0);
    auto it = local_.find(name);
    const bool cacheable = response.type != Response::Type::kError &&
                           response.type != Response::Type::kJoin &&
                           response.type != Response::Type::kAddProcessSet &&
                           response.type != Response::Type::kRemoveProcessSet;
    if (cacheable && cache_.enabled()) {
      Request request = it != local_.end() ? it->second : RequestFromResponse(response);
      Request evicted;
      const int slot = cache_.Put(response, request, &evicted);
      // The eviction took a slot this rank was waiting on: ask for that tensor the slow way.
      if (slot >= 0 && ClearCachedReady(slot)) {
        evicted.rank = link_.rank();
        local_[evicted.name] = evicted;
        uncached_.push_back(std::move(evicted));
      }
    }
    if (it != local_.end()) local_.erase(it);
  }
  decided_.clear();
}

void Controller::ReserveRoundStorage(std::vector<Request>& new_requests) {
  const int64_t threshold = parameters_.fusion_threshold_bytes;
  if (!cache_changed_ && reserved_threshold_ == threshold) return;
  cache_changed_ = false;
  reserved_threshold_ = threshold;
  const size_t slots = static_cast<size_t>(cache_.num_slots());
  // Only allreduces under the direct size are packed (executor.cc); the sum of all of them is
  // the most any round can fuse.
  size_t packed = 0;
  for (int slot = 0; slot < cache_.num_slots(); ++slot) {
    if (!cache_.occupied(slot)) continue;
    const Response& response = cache_.response(slot);
    const size_t bytes = static_cast<size_t>(response.total_bytes);
    if (response.type == Response::Type::kAllreduce &&
        bytes < FusionBuffer::kDirectAllreduceBytes) {
      packed += bytes;
    }
  }
  round_.max_fused_bytes = std::min(packed, static_cast<size_t>(std::max<int64_t>(threshold, 0)));
  round_.max_parts = slots;
  new_requests.reserve(slots);
  order_.reserve(slots);
  ready_slots_.reserve(slots);
  used_.reserve(slots);
  round_.parts.reserve(slots);
  round_.ends.reserve(slots);
}

bool Controller::HasWork() const {
  if (!local_.empty() || !uncached_.empty()) return true;
  for (uint64_t word : cached_ready_) {
    if (word != 0) return true;
  }
  return false;
}

const Controller::Round& Controller::Negotiate(std::vector<Request>& new_requests,
                                               bool shutdown_requested) {
  CommitPreviousRound();
  TakeNewRequests(new_requests);
  const BitLayout layout = WriteBits(shutdown_requested);
  const uint64_t tag = StageTensor();
  const uint64_t agreed_tag = AgreeOnBits(layout, tag);
  const uint64_t flags = ReadRound(layout);
  if ((flags & kFlagNoUncached) == 0) ExchangeUncached();
  if ((flags & kFlagNoStallCheck) == 0) ExchangeStallReports();
  ApplyCacheSetting();
  Fuse(parameters_.fusion_threshold_bytes);
  // Every rank staged the tensor the round runs alone (the agreed tag is nonzero only where
  // all gave the same, and the parts are the same everywhere): the same answer on every rank.
  round_.staged = agreed_tag != 0 && agreed_tag == tag && round_.parts.size() == 1 &&
                          round_.parts[0] == staged_response_
                      ? staged_token_
                      : 0;
  return round_;
}

uint64_t Controller::StageTensor() {
  staged_response_ = nullptr;
  staged_token_ = 0;
  if (!stage_ || link_.size() == 1 || joined_ || !uncached_.empty() || !cache_active_) return 0;
  int slot = -1;
  for (size_t w = 0; w < cached_ready_.size(); ++w) {
    const uint64_t word = cached_ready_[w];
    if (word == 0) continue;
    if (slot >= 0 || (word & (word - 1)) != 0) return 0;  // more than one tensor ready
    slot = static_cast<int>(w * 64) + __builtin_ctzll(word);
  }
  if (slot < 0 || !cache_.occupied(slot)) return 0;
  const Response& response = cache_.response(slot);
  if (response.type != Response::Type::kAllreduce || response.device >= 0 ||
      response.names.size() != 1) {
    return 0;
  }
  const uint64_t token = stage_(response);
  if (token == 0) return 0;
  staged_response_ = &response;
  staged_token_ = token;
  // The slot names the tensor alike on every rank; the token's low half (it counts the
  // provider's calls) tells stagings of it in different calls apart.
  return (static_cast<uint64_t>(slot) + 1) << 32 | (token & 0xffffffffULL);
}

void Controller::TakeNewRequests(std::vector<Request>& new_requests) {
  for (Request& request : new_requests) {
    if (request.op == OpType::kJoin) joined_ = true;
    int slot = -1;
    // Grouped calls always go to the coordinator, which releases a group only when all of it
    // is ready; a group split between cache and coordinator could never complete.
    auto lookup = cache_.enabled() && request.group_id == 0 ? cache_.Find(request, &slot)
                                                            : ResponseCache::Lookup::kMiss;
    if (lookup == ResponseCache::Lookup::kHit) {
      SetCachedReady(slot);
    } else {
      local_[request.name] = request;
      uncached_.push_back(std::move(request));
    }
  }
  new_requests.clear();
  ReserveRoundStorage(new_requests);
}

Controller::BitLayout Controller::WriteBits(bool shutdown_requested) {
  BitLayout layout;
  layout.slots = cache_.num_slots();
  layout.words = (static_cast<size_t>(layout.slots) + 63) / 64;
  const size_t rank_words = (static_cast<size_t>(link_.size()) + 63) / 64;
  std::vector<uint64_t>& bits = bits_;
  bits.assign(1 + 2 * layout.words + rank_words, 0);
  bits[0] = (uncached_.empty() ? kFlagNoUncached : 0) |
            (shutdown_requested ? 0 : kFlagNoShutdown) |
            (link_.rank() == kCoordinator &&
                     stall_inspector_.CheckDue(std::chrono::steady_clock::now())
                 ? 0
                 : kFlagNoStallCheck);
  uint64_t* ready = bits.data() + layout.ready();
  uint64_t* not_stale = bits.data() + layout.not_stale();
  uint64_t* not_shutting_down = bits.data() + layout.not_shutting_down();
  for (size_t w = 0; w < rank_words; ++w) not_shutting_down[w] = ~0ULL;
  if (shutdown_requested) {
    not_shutting_down[link_.rank() / 64] &= ~(1ULL << (link_.rank() % 64));
  }
  for (size_t w = 0; w < layout.words && w < cached_ready_.size(); ++w) ready[w] = cached_ready_[w];
  for (size_t w = 0; w < layout.words; ++w) not_stale[w] = ~0ULL;
  if (joined_) {
    for (int slot = 0; slot < layout.slots; ++slot) {
      if (!cache_.occupied(slot)) continue;
      if (cache_.response(slot).type == Response::Type::kAllreduce) {
        // A joined rank contributes zeros to any allreduce the others are ready for.
        ready[slot / 64] |= 1ULL << (slot % 64);
      } else {
        // Any other cached collective cannot run without this rank; marked stale, it goes to
        // the coordinator the slow way from the ranks that submit it, and fails there naming
        // the joined ranks, instead of waiting forever for this rank's ready bit.
        not_stale[slot / 64] &= ~(1ULL << (slot % 64));
      }
    }
  }
  for (const Request& request : uncached_) {
    int slot = -1;
    if (cache_.enabled() && cache_.Find(request, &slot) == ResponseCache::Lookup::kInvalid) {
      not_stale[slot / 64] &= ~(1ULL << (slot % 64));
    }
  }
  return layout;
}

uint64_t Controller::AgreeOnBits(const BitLayout& layout, uint64_t staged) {
  std::vector<uint64_t>& bits = bits_;
  const size_t parameter_words = bits.size();
  if (carries_parameters_) {
    if (link_.rank() == kCoordinator) {
      proposal_.AppendTo(bits);
    } else {
      TunedParameters::AppendIdentityTo(bits);
    }
  }
  bits.push_back(staged);  // last, combined by equality
  BitwiseAndAllreduce(link_, bits, kCoordinator, bits_scratch_, /*equal_words=*/1);
  const uint64_t agreed = bits.back();
  bits.pop_back();
  if (carries_parameters_) {
    const TunedParameters decided = TunedParameters::FromWords(bits.data() + parameter_words);
    if (decided != parameters_) {
      parameters_ = decided;
      parameters_round_ = rounds_;
    }
  }
  ++rounds_;
  return agreed;
}

uint64_t Controller::ReadRound(const BitLayout& layout) {
  const std::vector<uint64_t>& bits = bits_;
  auto bit = [&](size_t start, int i) { return (bits[start + i / 64] >> (i % 64) & 1) != 0; };
  Round& round = round_;
  round.parts.clear();
  round.ends.clear();
  round.shutdown_ranks.clear();
  round.shutdown = (bits[0] & kFlagNoShutdown) == 0;
  for (int r = 0; round.shutdown && r < link_.size(); ++r) {
    if (!bit(layout.not_shutting_down(), r)) round.shutdown_ranks.push_back(r);
  }
  // Stale entries go on every rank; whoever had them ready asks again the slow way.
  for (int slot = 0; slot < layout.slots; ++slot) {
    if (!bit(layout.not_stale(), slot)) {
      ToUncached(slot);
      cache_.Erase(slot);
      cache_changed_ = true;
    }
  }
  // Cached tensors ready everywhere run in slot order.
  order_.clear();
  for (int slot = 0; slot < layout.slots; ++slot) {
    if (bit(layout.ready(), slot) && cache_.occupied(slot)) {
      order_.push_back(&cache_.response(slot));
      ready_slots_.push_back(slot);
      ClearCachedReady(slot);
    }
  }
  return bits[0];
}

void Controller::ExchangeUncached() {
  WireWriter writer;
  EncodeRequests(uncached_, writer);
  uncached_.clear();
  auto gathered = GatherToRoot(link_, writer.bytes(), kCoordinator);
  WireWriter reply;
  if (link_.rank() == kCoordinator) {
    EncodeResponses(CoordinatorCollect(gathered), reply);
  }
  BroadcastFromRoot(link_, reply.bytes(), kCoordinator);
  decided_ = DecodeResponses(reply.bytes().data(), reply.bytes().size());
  for (const Response& response : decided_) order_.push_back(&response);
}

Response Controller::JoinedError(const std::string& name, const Request& request) const {
  Response error;
  error.type = Response::Type::kError;
  error.names = {name};
  error.group_id = request.group_id;
  error.group_size = request.group_size;
  std::string ranks;
  for (int r : joined_ranks_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  error.error_message = std::string(OpTypeName(request.op)) + " of tensor '" + name +
                        "' cannot proceed: " + (joined_ranks_.size() == 1 ? "rank " : "ranks ") +
                        ranks + " already called join(); only allreduce continues after a join";
  return error;
}

std::vector<Response> Controller::CoordinatorCollect(
    const std::vector<std::vector<uint8_t>>& messages) {
  const int n = link_.size();
  const auto now = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    for (Request& request : DecodeRequests(messages[r].data(), messages[r].size())) {
      if (request.op == OpType::kJoin) {
        joined_ranks_.insert(r);
        last_joined_ = r;
        continue;
      }
      auto it = table_.find(request.name);
      if (it == table_.end()) {
        Pending pending;
        pending.by_rank.resize(n);
        pending.present.assign(n, false);
        pending.first_seen = now;
        uint64_t seq = sequence_++;
        arrival_order_[seq] = request.name;
        it = table_.emplace(request.name, std::make_pair(seq, std::move(pending))).first;
      }
      Pending& pending = it->second.second;
      if (!pending.present[r]) {
        pending.present[r] = true;
        ++pending.count;
      }
      pending.by_rank[r] = std::move(request);
    }
  }
  std::vector<Response> responses;
  for (auto order = arrival_order_.begin(); order != arrival_order_.end();) {
    auto it = table_.find(order->second);
    Pending& pending = it->second.second;
    if (!joined_ranks_.empty() && pending.count < n) {
      // After a join only allreduces continue. Any other collective fails at once on each rank
      // that submits it, as in Horovod, not once every rank still in submitted it: ranks that
      // joined at different points name their unnamed calls differently, and would wait for
      // each other's names until the stall check stopped the job.
      const Request* first = nullptr;
      for (int r = 0; r < n && first == nullptr; ++r) {
        if (pending.present[r]) first = &pending.by_rank[r];
      }
      if (first->op != OpType::kAllreduce) {
        responses.push_back(JoinedError(it->first, *first));
        table_.erase(it);
        order = arrival_order_.erase(order);
        continue;
      }
    }
    // Joined ranks stand in for the tensors they will never submit.
    int absent_joined = 0;
    for (int r : joined_ranks_) absent_joined += pending.present[r] ? 0 : 1;
    if (pending.count + absent_joined < n) {
      ++order;
      continue;
    }
    responses.push_back(BuildResponse(it->first, pending.by_rank, pending.present));
    table_.erase(it);
    order = arrival_order_.erase(order);
  }
  responses = ReleaseGroups(std::move(responses));
  if (static_cast<int>(joined_ranks_.size()) == n) {
    Response join;
    join.type = Response::Type::kJoin;
    join.names = {"join"};
    join.control.last_joined_rank = last_joined_;
    responses.push_back(std::move(join));
    joined_ranks_.clear();
    last_joined_ = -1;
  }
  return responses;
}

std::vector<Response> Controller::ReleaseGroups(std::vector<Response> responses) {
  std::vector<Response> released;
  for (Response& response : responses) {
    if (response.group_id == 0) {
      released.push_back(std::move(response));
      continue;
    }
    // Errors wait for their group too: a member that failed fails the whole group, on every
    // rank, instead of leaving the others waiting for it.
    const int64_t id = response.group_id;
    auto& members = group_ready_[id];
    members.push_back(std::move(response));
    if (static_cast<int32_t>(members.size()) < members.front().group_size) continue;
    const Response* failed = nullptr;
    for (const Response& member : members) {
      if (member.type == Response::Type::kError) {
        failed = &member;
        break;
      }
    }
    if (failed != nullptr) {
      const std::string failed_name = failed->names.at(0);
      const std::string reason = failed->error_message;
      for (Response& member : members) {
        if (member.type == Response::Type::kError) continue;
        member.type = Response::Type::kError;
        member.error_message = "tensor '" + member.names.at(0) + "' is in a grouped call with '" +
                               failed_name + "', which failed: " + reason;
      }
    }
    for (Response& member : members) released.push_back(std::move(member));
    group_ready_.erase(id);
  }
  return released;
}

void Controller::Fuse(int64_t threshold) {
  const size_t n = order_.size();
  used_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (used_[i]) continue;
    const Response& first = *order_[i];
    used_[i] = 1;
    round_.parts.push_back(&first);
    int64_t total_bytes = first.total_bytes;
    const bool allreduce = first.type == Response::Type::kAllreduce;
    const bool grouped_gather = first.group_id != 0 &&
                                (first.type == Response::Type::kAllgather ||
                                 first.type == Response::Type::kReducescatter);
    if (allreduce || grouped_gather) {
      for (size_t j = i + 1; j < n; ++j) {
        const Response& r = *order_[j];
        // Members of one group always fuse; other allreduces while under the threshold.
        const bool same_group = first.group_id != 0 && r.group_id == first.group_id;
        if (used_[j] || r.type != first.type || r.dtype != first.dtype ||
            r.reduce_op != first.reduce_op || r.prescale != first.prescale ||
            r.postscale != first.postscale || r.device != first.device ||
            (!same_group && (!allreduce || r.group_id != 0 ||
                             total_bytes + r.total_bytes > threshold))) {
          continue;
        }
        round_.parts.push_back(&r);
        total_bytes += r.total_bytes;
        used_[j] = 1;
      }
    }
    round_.ends.push_back(round_.parts.size());
  }
}

}  // namespace horovodlike
