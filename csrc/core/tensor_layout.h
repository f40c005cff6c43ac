// How a collective lays a tensor's rows out over the ranks, shared by the host executor and the
// GPU path so that both compute the same sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/common.h"
#include "message.h"
#include "tensor_queue.h"

namespace horovodlike {

// Bytes of one row (the first dimension's unit) of a tensor of `shape` and `dtype`.
inline size_t RowBytes(const std::vector<int64_t>& shape, DataType dtype) {
  size_t row = DataTypeSize(dtype);
  for (size_t i = 1; i < shape.size(); ++i) row *= static_cast<size_t>(shape[i]);
  return row;
}

// Rows of a first dimension of `rows` that rank r of n receives in a reduce-scatter: as even
// as possible, the first (rows % n) ranks one more.
inline int64_t ScatterRows(int64_t rows, int r, int n) {
  return rows / n + (r < rows % n ? 1 : 0);
}

// A reduce-scatter of `entries` (fused) over n ranks: each tensor's elements per row, the
// elements of every rank's block (its rows of every tensor in turn), and the elements in all.
struct ScatterLayout {
  std::vector<size_t> row_elems;
  std::vector<size_t> block_counts;
  size_t total = 0;
};
inline ScatterLayout LayReducescatter(const std::vector<TensorEntry>& entries, DataType dtype,
                                      int n) {
  ScatterLayout layout;
  layout.row_elems.resize(entries.size());
  layout.block_counts.assign(n, 0);
  for (size_t t = 0; t < entries.size(); ++t) {
    const std::vector<int64_t>& shape = entries[t].request.shape;
    layout.row_elems[t] = RowBytes(shape, dtype) / DataTypeSize(dtype);
    for (int r = 0; r < n; ++r) {
      layout.block_counts[r] +=
          static_cast<size_t>(ScatterRows(shape[0], r, n)) * layout.row_elems[t];
    }
    layout.total += static_cast<size_t>(NumElements(shape));
  }
  return layout;
}

// An alltoall's sizes for `rank` of `n`, from the response's n x n matrix (row i: the rows rank
// i sends to each rank).
struct AlltoallLayout {
  std::vector<size_t> send_bytes;  // to each rank
  std::vector<size_t> recv_bytes;  // from each rank
  std::vector<int64_t> received;   // rows from each rank
  int64_t total_rows = 0;          // received in all
};
inline AlltoallLayout LayAlltoall(const Response& response, int rank, int n, size_t row_bytes) {
  AlltoallLayout layout;
  layout.send_bytes.resize(n);
  layout.recv_bytes.resize(n);
  layout.received.resize(n);
  for (int j = 0; j < n; ++j) {
    layout.send_bytes[j] = static_cast<size_t>(response.alltoall_rows[rank * n + j]) * row_bytes;
    layout.received[j] = response.alltoall_rows[j * n + rank];
    layout.recv_bytes[j] = static_cast<size_t>(layout.received[j]) * row_bytes;
    layout.total_rows += layout.received[j];
  }
  return layout;
}

}  // namespace horovodlike
