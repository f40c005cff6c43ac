// Adasum allreduce (Maleki et al., "Scaling Distributed Training with Adaptive Summation"):
// gradients are combined so that their common component counts once and their orthogonal
// components add, by recursive doubling over a power-of-two number of ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/common.h"
#include "../links/link.h"

namespace horovodlike {

class AdasumAllreduce {
 public:
  // Why `tensor` cannot be reduced with Adasum over `ranks` ranks (`where` names them, e.g.
  // "this job"), or "" when it can. Checked before anything is sent.
  static std::string CheckArguments(const std::string& tensor, DataType dtype, int ranks,
                                    const std::string& where);

  // Combines `buf` in place across all ranks of `link`: `counts` are the element counts
  // of the tensors laid end to end in it, each combined with its own dot products. Every rank
  // ends with identical bits. Throws InvalidArgument (nothing sent) for the cases above,
  // naming `tensor`.
  void Run(Link& link, void* buf, const size_t* counts, size_t num_tensors,
           DataType dtype, const std::string& tensor);

 private:
  std::vector<uint8_t> partner_;  // reused across calls: the partner's whole buffer
};

}  // namespace horovodlike
