#include "response_builder.h"

#include <algorithm>
#include <functional>
#include <sstream>

namespace horovodlike {
namespace {

// "rank 0: [2, 3]; ranks 1, 2: [3, 3]" for the values each rank reported.
std::string DescribeByRank(const std::vector<std::pair<int, std::string>>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, value] : values) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == value; });
    if (it == groups.end()) {
      groups.push_back({value, {rank}});
    } else {
      it->second.push_back(rank);
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

using Describe = std::function<std::string(const Request&)>;

// How each field is shown in a mismatch message (and compared).
std::string OpOf(const Request& r) { return OpTypeName(r.op); }
std::string DtypeOf(const Request& r) { return DataTypeName(r.dtype); }
std::string ShapeOf(const Request& r) { return ShapeString(r.shape); }
// The kind of memory only: each rank uses its own GPU (cuda:local_rank), as in Horovod.
std::string DeviceOf(const Request& r) { return r.device < 0 ? "cpu" : "cuda"; }
std::string ReduceOf(const Request& r) { return ReduceOpName(r.reduce_op); }
std::string ScaleOf(const Request& r) {
  return "prescale " + FormatDouble(r.prescale) + ", postscale " + FormatDouble(r.postscale);
}
std::string RankOf(const Request& r) { return std::to_string(r.shape.size()); }
std::string TrailingOf(const Request& r) {
  return ShapeString(std::vector<int64_t>(r.shape.begin() + (r.shape.empty() ? 0 : 1),
                                          r.shape.end()));
}
std::string GroupOf(const Request& r) {
  return r.group_id == 0 ? std::string("not grouped")
                         : "a group of " + std::to_string(r.group_size);
}
std::string RootOf(const Request& r) { return std::to_string(r.root_rank); }

// The requests of the ranks that submitted one tensor, and the response being built for it.
class Agreement {
 public:
  Agreement(const std::string& name, const std::vector<Request>& all,
            const std::vector<bool>& present)
      : name_(name), all_(all), present_(present) {
    // Only ranks that submitted the tensor are compared; joined ranks are absent.
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      if (present[r]) {
        requests_.push_back(&all[r]);
        ranks_.push_back(r);
      }
    }
    response_.names = {name};
  }

  const Request& first() const { return *requests_[0]; }
  Response& response() { return response_; }

  bool AllSame(const Describe& describe) const {
    const std::string expected = describe(first());
    for (const Request* r : requests_) {
      if (describe(*r) != expected) return false;
    }
    return true;
  }

  Response Fail(const std::string& message) {
    response_.type = Response::Type::kError;
    response_.error_message = message;
    // Once the ranks agree on the grouping, an error keeps it, so that the whole group fails
    // as one (Controller::ReleaseGroups).
    if (same_grouping_) {
      response_.group_id = first().group_id;
      response_.group_size = first().group_size;
    }
    return response_;
  }

  Response Mismatch(const std::string& what, const Describe& describe) {
    std::vector<std::pair<int, std::string>> values;
    for (size_t i = 0; i < requests_.size(); ++i) {
      values.push_back({ranks_[i], describe(*requests_[i])});
    }
    return Fail("Mismatched " + what + " for tensor '" + name_ + "' across ranks: " +
                DescribeByRank(values) + ".");
  }

  // The checks every collective shares; false (with the error in response()) on a mismatch.
  bool CheckCommon() {
    if (!AllSame(OpOf)) return Failed(Mismatch("collective operations", OpOf));
    if (!AllSame(DtypeOf)) return Failed(Mismatch("data types", DtypeOf));
    if (!AllSame(DeviceOf)) return Failed(Mismatch("devices", DeviceOf));
    if (!AllSame(GroupOf)) return Failed(Mismatch("grouping", GroupOf));
    same_grouping_ = true;
    // Only allreduces get here without every rank: the coordinator fails any other
    // collective submitted after a join at once (Controller::JoinedError).
    return true;
  }

  const std::vector<const Request*>& requests() const { return requests_; }

 private:
  bool Failed(const Response&) { return false; }

  const std::string& name_;
  const std::vector<Request>& all_;
  const std::vector<bool>& present_;
  std::vector<const Request*> requests_;
  std::vector<int> ranks_;
  Response response_;
  bool same_grouping_ = false;
};

Response BuildReduction(Agreement& a) {
  const Request& first = a.first();
  if (!a.AllSame(ShapeOf)) return a.Mismatch("shapes", ShapeOf);
  if (!a.AllSame(ReduceOf)) return a.Mismatch("reduce operations", ReduceOf);
  if (!a.AllSame(ScaleOf)) return a.Mismatch("scale factors", ScaleOf);
  Response& response = a.response();
  response.type = first.op == OpType::kAllreduce ? Response::Type::kAllreduce
                                                 : Response::Type::kReducescatter;
  response.reduce_op = first.reduce_op;
  response.prescale = first.prescale;
  response.postscale = first.postscale;
  response.tensor_sizes = {NumElements(first.shape)};
  response.total_bytes =
      NumElements(first.shape) * static_cast<int64_t>(DataTypeSize(first.dtype));
  return response;
}

// Allgather and alltoall: the first dimension may differ between ranks, nothing else.
Response BuildGather(Agreement& a) {
  if (!a.AllSame(RankOf)) return a.Mismatch("numbers of dimensions", ShapeOf);
  if (!a.AllSame(TrailingOf)) {
    return a.Mismatch("shapes (all but the first dimension must agree)", ShapeOf);
  }
  Response& response = a.response();
  if (a.first().op == OpType::kAllgather) {
    response.type = Response::Type::kAllgather;
    for (const Request* r : a.requests()) response.first_dims.push_back(r->shape[0]);
  } else {
    response.type = Response::Type::kAlltoall;
    for (const Request* r : a.requests()) {
      response.alltoall_rows.insert(response.alltoall_rows.end(), r->splits.begin(),
                                    r->splits.end());
    }
  }
  return response;
}

Response BuildBroadcast(Agreement& a) {
  if (!a.AllSame(RootOf)) return a.Mismatch("root ranks", RootOf);
  if (!a.AllSame(ShapeOf)) return a.Mismatch("shapes", ShapeOf);
  a.response().type = Response::Type::kBroadcast;
  a.response().root_rank = a.first().root_rank;
  return a.response();
}

// Control operations: every rank must ask for the same change.
Response BuildProcessSetChange(Agreement& a) {
  auto members = [](const Request& r) {
    if (r.op == OpType::kRemoveProcessSet) return std::to_string(r.control.process_set_id);
    return ShapeString(std::vector<int64_t>(r.control.ranks.begin(), r.control.ranks.end()));
  };
  if (!a.AllSame(members)) {
    return a.Mismatch(a.first().op == OpType::kRemoveProcessSet ? "process set ids"
                                                                 : "process set ranks",
                      members);
  }
  a.response().type = static_cast<Response::Type>(a.first().op);
  a.response().control.ranks = a.first().control.ranks;
  a.response().control.process_set_id = a.first().control.process_set_id;
  return a.response();
}

}  // namespace

Response BuildResponse(const std::string& name, const std::vector<Request>& all,
                       const std::vector<bool>& present) {
  Agreement a(name, all, present);
  if (!a.CheckCommon()) return a.response();
  const Request& first = a.first();
  Response& response = a.response();
  response.dtype = first.dtype;
  response.device = first.device;
  response.shape = first.shape;
  response.group_id = first.group_id;
  response.group_size = first.group_size;
  switch (first.op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      return BuildReduction(a);
    case OpType::kAllgather:
    case OpType::kAlltoall:
      return BuildGather(a);
    case OpType::kBroadcast:
      return BuildBroadcast(a);
    case OpType::kAddProcessSet:
    case OpType::kRemoveProcessSet:
      return BuildProcessSetChange(a);
    case OpType::kBarrier:
    case OpType::kJoin:
      response.type = static_cast<Response::Type>(first.op);
      break;
  }
  return response;
}

}  // namespace horovodlike
