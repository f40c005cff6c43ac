// The coordinator's check of one tensor: every rank that submitted it asked for the same
// collective with compatible parameters. The result is the response to run, or an error
// response naming the tensor, the ranks and what differed (the job goes on).
#pragma once

#include <string>
#include <vector>

#include "message.h"

namespace horovodlike {

// `all` holds one request per rank of the set; `present[r]` says whether rank r submitted it
// (ranks that called join() did not, and stand in with zeros for an allreduce).
Response BuildResponse(const std::string& name, const std::vector<Request>& all,
                       const std::vector<bool>& present);

}  // namespace horovodlike
