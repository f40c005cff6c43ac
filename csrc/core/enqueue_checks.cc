#include "enqueue_checks.h"

#include <algorithm>

#include "../collectives/adasum_allreduce.h"

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

}  // namespace

void CheckTensorArgs(const EnqueueArgs& args) {
  if (args.name.empty()) throw InvalidArgument("a collective needs a non-empty name");
  if (args.name.find_first_of(" \n") != std::string::npos) {
    throw InvalidArgument("tensor name '" + args.name + "' must not contain spaces or newlines");
  }
  for (int64_t d : args.shape) {
    if (d < 0) throw InvalidArgument("tensor '" + args.name + "' has a negative dimension");
  }
  if (args.dtype == DataType::kBool &&
      (args.reduce_op == ReduceOp::kAverage || args.prescale != 1.0 || args.postscale != 1.0) &&
      (args.op == OpType::kAllreduce || args.op == OpType::kReducescatter)) {
    throw InvalidArgument(std::string(OpTypeName(args.op)) + " of '" + args.name +
                          "': the tensor is bool, and Average and scale factors are not "
                          "defined for bool; use Sum (logical or), Min, Max or Product");
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
