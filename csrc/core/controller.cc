#include "controller.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "logging.h"
#include "../collectives/star_exchange.h"

namespace horovodlike {
namespace {

constexpr uint64_t kFlagNoUncached = 1;  // set: this rank has no uncached work
constexpr uint64_t kFlagNoShutdown = 2;  // set: this rank is not shutting down

// "rank 0: [2, 3]; ranks 1, 2: [3, 3]" for the values each rank reported.
std::string DescribeByRank(const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == values[r]; });
    if (it == groups.end()) {
      groups.push_back({values[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::ostringstream out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& ranks = groups[g].second;
    out << (g ? "; " : "") << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
    out << ": " << groups[g].first;
  }
  return out.str();
}

std::string FormatDouble(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

Controller::Controller(Transport& transport, const Config& config)
    : transport_(transport), config_(config), cache_(config.cache_capacity),
      last_stall_check_(std::chrono::steady_clock::now()) {}

void Controller::ToUncached(int slot) {
  if (cached_ready_.erase(slot) == 0) return;
  const std::string& name = cache_.response(slot).names.at(0);
  uncached_.push_back(local_.at(name));
}

Controller::Round Controller::Negotiate(std::vector<Request> new_requests,
                                        bool shutdown_requested) {
  for (Request& request : new_requests) {
    int slot = -1;
    auto lookup = cache_.enabled() ? cache_.Find(request, &slot) : ResponseCache::Lookup::kMiss;
    local_[request.name] = request;
    if (lookup == ResponseCache::Lookup::kHit) {
      cached_ready_.insert(slot);
    } else {
      uncached_.push_back(std::move(request));
    }
  }

  // Bit vector: [flags][ready bits][not-stale bits], all combined with AND.
  const int slots = cache_.num_slots();
  const size_t words = (static_cast<size_t>(slots) + 63) / 64;
  std::vector<uint64_t> bits(1 + 2 * words, 0);
  bits[0] = (uncached_.empty() ? kFlagNoUncached : 0) |
            (shutdown_requested ? 0 : kFlagNoShutdown);
  for (int slot : cached_ready_) bits[1 + slot / 64] |= 1ULL << (slot % 64);
  for (size_t w = 0; w < words; ++w) bits[1 + words + w] = ~0ULL;
  for (const Request& request : uncached_) {
    int slot = -1;
    if (cache_.enabled() && cache_.Find(request, &slot) == ResponseCache::Lookup::kInvalid) {
      bits[1 + words + slot / 64] &= ~(1ULL << (slot % 64));
    }
  }
  BitwiseAndAllreduce(transport_, bits, kCoordinator);

  Round round;
  round.shutdown = (bits[0] & kFlagNoShutdown) == 0;
  const bool any_uncached = (bits[0] & kFlagNoUncached) == 0;

  // Stale entries go on every rank; whoever had them ready asks again the slow way.
  for (int slot = 0; slot < slots; ++slot) {
    if ((bits[1 + words + slot / 64] >> (slot % 64) & 1) == 0) {
      ToUncached(slot);
      cache_.Erase(slot);
    }
  }
  std::vector<Response> ready;
  for (int slot = 0; slot < slots; ++slot) {
    if ((bits[1 + slot / 64] >> (slot % 64) & 1) != 0 && cache_.occupied(slot)) {
      ready.push_back(cache_.response(slot));
      cached_ready_.erase(slot);
    }
  }

  if (any_uncached) {
    WireWriter writer;
    EncodeRequests(uncached_, writer);
    uncached_.clear();
    auto gathered = GatherToRoot(transport_, writer.bytes(), kCoordinator);
    WireWriter reply;
    if (transport_.rank() == kCoordinator) {
      EncodeResponses(CoordinatorCollect(gathered), reply);
    }
    BroadcastFromRoot(transport_, reply.bytes(), kCoordinator);
    auto decided = DecodeResponses(reply.bytes().data(), reply.bytes().size());
    ready.insert(ready.end(), std::make_move_iterator(decided.begin()),
                 std::make_move_iterator(decided.end()));
  }
  if (transport_.rank() == kCoordinator && config_.stall_check_enabled) CheckForStalls();

  // Every rank updates its cache with the same responses in the same order.
  for (const Response& response : ready) {
    for (const std::string& name : response.names) {
      auto it = local_.find(name);
      if (it == local_.end()) continue;
      if (response.type != Response::Type::kError && cache_.enabled()) {
        Response single = response;
        single.names = {name};
        std::string evicted;
        int slot = cache_.Put(single, it->second, &evicted);
        // The eviction took a slot this rank was waiting on: ask for that tensor the slow way.
        if (slot >= 0 && cached_ready_.erase(slot) > 0) uncached_.push_back(local_.at(evicted));
      }
      local_.erase(it);
    }
  }
  round.responses = Fuse(ready, config_.fusion_threshold_bytes);
  return round;
}

std::vector<Response> Controller::CoordinatorCollect(
    const std::vector<std::vector<uint8_t>>& messages) {
  const int n = transport_.size();
  const auto now = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    for (Request& request : DecodeRequests(messages[r].data(), messages[r].size())) {
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
    if (it->second.second.count < n) {
      ++order;
      continue;
    }
    responses.push_back(BuildResponse(it->first, it->second.second.by_rank));
    table_.erase(it);
    order = arrival_order_.erase(order);
  }
  return responses;
}

Response Controller::BuildResponse(const std::string& name,
                                   const std::vector<Request>& requests) const {
  const Request& first = requests[0];
  Response response;
  response.names = {name};
  auto mismatch = [&](const std::string& what,
                      const std::function<std::string(const Request&)>& describe) {
    std::vector<std::string> values;
    for (const Request& r : requests) values.push_back(describe(r));
    response.type = Response::Type::kError;
    response.error_message = "Mismatched " + what + " for tensor '" + name +
                             "' across ranks: " + DescribeByRank(values) + ".";
    return response;
  };
  auto all_same = [&](const std::function<std::string(const Request&)>& describe) {
    for (const Request& r : requests) {
      if (describe(r) != describe(first)) return false;
    }
    return true;
  };
  auto op = [](const Request& r) { return std::string(OpTypeName(r.op)); };
  auto dtype = [](const Request& r) { return std::string(DataTypeName(r.dtype)); };
  auto shape = [](const Request& r) { return ShapeString(r.shape); };
  auto device = [](const Request& r) {
    return r.device < 0 ? std::string("cpu") : "cuda:" + std::to_string(r.device);
  };
  if (!all_same(op)) return mismatch("collective operations", op);
  if (!all_same(dtype)) return mismatch("data types", dtype);
  if (!all_same(device)) return mismatch("devices", device);

  response.dtype = first.dtype;
  response.device = first.device;
  switch (first.op) {
    case OpType::kAllreduce: {
      if (!all_same(shape)) return mismatch("shapes", shape);
      auto reduce = [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); };
      if (!all_same(reduce)) return mismatch("reduce operations", reduce);
      auto scale = [](const Request& r) {
        return "prescale " + FormatDouble(r.prescale) + ", postscale " + FormatDouble(r.postscale);
      };
      if (!all_same(scale)) return mismatch("scale factors", scale);
      response.type = Response::Type::kAllreduce;
      response.reduce_op = first.reduce_op;
      response.prescale = first.prescale;
      response.postscale = first.postscale;
      response.total_bytes = NumElements(first.shape) *
                             static_cast<int64_t>(DataTypeSize(first.dtype));
      break;
    }
    case OpType::kAllgather: {
      auto rank_of = [](const Request& r) { return std::to_string(r.shape.size()); };
      if (!all_same(rank_of)) return mismatch("numbers of dimensions", shape);
      auto trailing = [](const Request& r) {
        return ShapeString(std::vector<int64_t>(r.shape.begin() + 1, r.shape.end()));
      };
      if (!all_same(trailing)) {
        return mismatch("shapes (all but the first dimension must agree)", shape);
      }
      response.type = Response::Type::kAllgather;
      for (const Request& r : requests) response.first_dims.push_back(r.shape[0]);
      break;
    }
    case OpType::kBroadcast: {
      auto root = [](const Request& r) { return std::to_string(r.root_rank); };
      if (!all_same(root)) return mismatch("root ranks", root);
      if (!all_same(shape)) return mismatch("shapes", shape);
      response.type = Response::Type::kBroadcast;
      response.root_rank = first.root_rank;
      break;
    }
    case OpType::kBarrier:
      response.type = Response::Type::kBarrier;
      break;
  }
  return response;
}

void Controller::CheckForStalls() {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(config_.stall_warning_seconds);
  if (now - last_stall_check_ < limit) return;
  last_stall_check_ = now;
  std::ostringstream report;
  int stalled = 0;
  for (const auto& [seq, name] : arrival_order_) {
    const Pending& pending = table_.at(name).second;
    if (now - pending.first_seen < limit) continue;
    std::vector<int> missing;
    for (int r = 0; r < transport_.size(); ++r) if (!pending.present[r]) missing.push_back(r);
    report << "\n  " << name << ": missing ranks ";
    for (size_t i = 0; i < missing.size(); ++i) report << (i ? ", " : "") << missing[i];
    ++stalled;
  }
  if (stalled > 0) {
    HVDL_LOG(kWarning, "One or more tensors were submitted by some ranks but not by others for "
                       "over " << config_.stall_warning_seconds << " s. This may mean the ranks "
                       "run different code paths or one of them is stuck:" << report.str());
  }
}

std::vector<Response> Controller::Fuse(const std::vector<Response>& responses,
                                       int64_t threshold) {
  std::vector<Response> fused;
  std::vector<bool> used(responses.size(), false);
  for (size_t i = 0; i < responses.size(); ++i) {
    if (used[i]) continue;
    Response group = responses[i];
    used[i] = true;
    if (group.type == Response::Type::kAllreduce) {
      for (size_t j = i + 1; j < responses.size(); ++j) {
        const Response& r = responses[j];
        if (used[j] || r.type != Response::Type::kAllreduce || r.dtype != group.dtype ||
            r.reduce_op != group.reduce_op || r.prescale != group.prescale ||
            r.postscale != group.postscale || r.device != group.device ||
            group.total_bytes + r.total_bytes > threshold) {
          continue;
        }
        group.names.insert(group.names.end(), r.names.begin(), r.names.end());
        group.total_bytes += r.total_bytes;
        used[j] = true;
      }
    }
    fused.push_back(std::move(group));
  }
  return fused;
}

}  // namespace horovodlike
