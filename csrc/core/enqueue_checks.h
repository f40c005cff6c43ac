// The checks of an enqueue that need no other rank: bad input raises InvalidArgument (a
// ValueError in Python) on the caller's thread, before anything is queued or sent.
#pragma once

#include <vector>

#include "runtime_args.h"

namespace horovodlike {

// The tensor itself: name, shape, device, dtype against the reduce op and scaling.
void CheckTensorArgs(const EnqueueArgs& args);
// Against the process set (`members`, its sorted global ranks) this rank (`rank`) runs it on:
// membership, roots, alltoall splits, Adasum's size rule, which ops need a dimension.
void CheckSetArgs(const EnqueueArgs& args, const std::vector<int>& members, int rank);

}  // namespace horovodlike
