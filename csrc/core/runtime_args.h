// What a caller hands the runtime for one collective over a tensor (Runtime::Enqueue;
// control operations go to Runtime::EnqueueControl).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../common/common.h"

namespace horovodlike {

struct EnqueueArgs {
  OpType op = OpType::kAllreduce;
  std::string name;
  const void* input = nullptr;
  void* output = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root_rank = 0;
  int device = -1;       // CUDA ordinal; -1: host memory
  void* stream = nullptr;  // CUDA: the caller's stream, on which the input is ready
  int process_set = 0;
  std::vector<int64_t> splits;  // alltoall: rows per destination
  int64_t group_id = 0;
  int group_size = 0;
  // The caller waits for this handle next (Runtime::WaitDriving): the loop is not woken for it.
  bool caller_waits = false;
};

}  // namespace horovodlike
