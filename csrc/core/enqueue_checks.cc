#include "enqueue_checks.h"

#include <algorithm>

#include "../collectives/adasum_allreduce.h"
#include "message.h"

namespace horovodlike {
namespace {

std::string SetName(int process_set) {
  return process_set == 0 ? std::string("this job")
                          : "process set " + std::to_string(process_set);
}

void CheckAlltoallSplits(const EnqueueArgs& args, int set_size) {
  if (args.shape.empty()) {
    throw InvalidArgument("alltoall of '" + args.name + "': a scalar cannot be split");
  }
  if (static_cast<int>(args.splits.size()) != set_size) {
    throw InvalidArgument("alltoall of '" + args.name + "': " +
                          std::to_string(args.splits.size()) + " splits for " +
                          std::to_string(set_size) + " ranks");
  }
  int64_t sum = 0;
  for (int64_t s : args.splits) {
    if (s < 0) throw InvalidArgument("alltoall of '" + args.name + "': negative split");
    sum += s;
  }
  if (sum != args.shape[0]) {
    throw InvalidArgument("alltoall of '" + args.name + "': splits " +
                          ShapeString(args.splits) + " add up to " + std::to_string(sum) +
                          ", not to the first dimension " + std::to_string(args.shape[0]));
  }
}

// A tensor with elements needs memory: a null pointer is one without storage (PyTorch's
// 'meta' device), which the collective would read or write through.
void CheckStorage(const EnqueueArgs& args) {
  if (std::find(args.shape.begin(), args.shape.end(), 0) != args.shape.end()) return;
  // Allreduce and broadcast write into the caller's output; the other ops allocate theirs.
  const bool writes_output = args.op == OpType::kAllreduce || args.op == OpType::kBroadcast;
  const char* which = nullptr;
  if (args.input == nullptr) {
    which = "input";
  } else if (writes_output && args.output == nullptr) {
    which = "output";
  } else {
    return;
  }
  throw InvalidArgument(std::string(OpTypeName(args.op)) + " of '" + args.name + "': the " +
                        which + " tensor (shape " + ShapeString(args.shape) + ") has no data: "
                        "its pointer is null, as for a tensor without storage (on PyTorch's "
                        "'meta' device, for one); pass a tensor on the CPU or a GPU");
}

}  // namespace

void CheckNameLength(const std::string& name, const std::string& what) {
  if (static_cast<int64_t>(name.size()) <= kMaxWireStringBytes) return;
  // Quoted in part: the whole name would make an error of more than a megabyte.
  size_t shown = 40;
  while (shown > 0 && (static_cast<uint8_t>(name[shown]) & 0xC0) == 0x80) --shown;
  throw InvalidArgument(what + " '" + name.substr(0, shown) + "...' is " +
                        std::to_string(name.size()) + " bytes long; names travel in messages "
                        "that carry at most " + std::to_string(kMaxWireStringBytes) +
                        " bytes (1 MiB) per string: use a shorter name");
}

void CheckTensorArgs(const EnqueueArgs& args) {
  if (args.name.empty()) throw InvalidArgument("a collective needs a non-empty name");
  CheckNameLength(args.name, "tensor name");
  if (args.name.find_first_of(" \n") != std::string::npos) {
    throw InvalidArgument("tensor name '" + args.name + "' must not contain spaces or newlines");
  }
  for (int64_t d : args.shape) {
    if (d < 0) throw InvalidArgument("tensor '" + args.name + "' has a negative dimension");
  }
  CheckStorage(args);
  if (args.dtype == DataType::kBool &&
      (args.reduce_op == ReduceOp::kAverage || args.prescale != 1.0 || args.postscale != 1.0) &&
      (args.op == OpType::kAllreduce || args.op == OpType::kReducescatter)) {
    throw InvalidArgument(std::string(OpTypeName(args.op)) + " of '" + args.name +
                          "': the tensor is bool, and Average and scale factors are not "
                          "defined for bool; use Sum (logical or), Min, Max or Product");
  }
}

void CheckProcessSetRanks(const std::vector<int>& ranks, int size) {
  if (ranks.empty()) throw InvalidArgument("add_process_set([]): a process set needs a rank");
  const std::string listed = "add_process_set(" +
                             ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end())) + ")";
  std::vector<int64_t> outside;
  for (int r : ranks) {
    if (r < 0 || r >= size) outside.push_back(r);
  }
  if (!outside.empty()) {
    const std::string which = outside.size() == 1 ? "rank " + std::to_string(outside[0]) + " is"
                                                  : "ranks " + ShapeString(outside) + " are";
    throw InvalidArgument(listed + ": " + which + " outside this job's ranks 0 to " +
                          std::to_string(size - 1));
  }
  std::vector<int> sorted(ranks);
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    throw InvalidArgument(listed + ": rank " + std::to_string(*twice) + " is listed twice");
  }
}

void CheckSetArgs(const EnqueueArgs& args, const std::vector<int>& members, int rank) {
  if (!std::binary_search(members.begin(), members.end(), rank)) {
    throw InvalidArgument("'" + args.name + "': rank " + std::to_string(rank) +
                          " is not in process set " + std::to_string(args.process_set) +
                          " (ranks " + ShapeString(std::vector<int64_t>(members.begin(),
                                                                        members.end())) + ")");
  }
  const int set_size = static_cast<int>(members.size());
  if (args.reduce_op == ReduceOp::kAdasum) {
    if (args.op == OpType::kReducescatter) {
      throw InvalidArgument("reducescatter of '" + args.name +
                            "': op=Adasum is only defined for allreduce; use Sum or Average");
    }
    // Every rank checks the same set size here, so all of them raise and nothing is sent.
    const std::string problem = AdasumAllreduce::CheckArguments(args.name, args.dtype, set_size,
                                                                SetName(args.process_set));
    if (!problem.empty()) throw InvalidArgument(problem);
  }
  if (args.op == OpType::kBroadcast && (args.root_rank < 0 || args.root_rank >= set_size)) {
    throw InvalidArgument("broadcast of '" + args.name + "': root_rank " +
                          std::to_string(args.root_rank) + " is not a rank of " +
                          SetName(args.process_set) + " (size " + std::to_string(set_size) + ")");
  }
  if (args.op == OpType::kAlltoall) CheckAlltoallSplits(args, set_size);
  if (args.op == OpType::kReducescatter && args.shape.empty()) {
    throw InvalidArgument("reducescatter of '" + args.name +
                          "': a scalar cannot be scattered; give it at least one dimension");
  }
  if (args.op == OpType::kAllgather && args.shape.empty()) {
    throw InvalidArgument("allgather of '" + args.name +
                          "': a scalar cannot be gathered; give it at least one dimension");
  }
}

}  // namespace horovodlike
