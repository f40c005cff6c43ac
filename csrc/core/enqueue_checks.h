// The checks of an enqueue that need no other rank: bad input raises InvalidArgument (a
// ValueError in Python) on the caller's thread, before anything is queued or sent.
#pragma once

#include <string>
#include <vector>

#include "runtime_args.h"

namespace horovodlike {

// The tensor itself: name, shape, storage (no null pointer with elements), dtype against the
// reduce op and scaling.
void CheckTensorArgs(const EnqueueArgs& args);
// A name that fits in a message (kMaxWireStringBytes); `what` says whose name it is.
void CheckNameLength(const std::string& name, const std::string& what);
// The ranks of a new process set in a job of `size` ranks: at least one, each once, each a rank
// of the job (a negative one cannot even be sent).
void CheckProcessSetRanks(const std::vector<int>& ranks, int size);
// Against the process set (`members`, its sorted global ranks) this rank (`rank`) runs it on:
// membership, roots, alltoall splits, Adasum's size rule, which ops need a dimension.
void CheckSetArgs(const EnqueueArgs& args, const std::vector<int>& members, int rank);

}  // namespace horovodlike
