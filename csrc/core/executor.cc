#include "executor.h"

#include <cstring>

#include "../collectives/chain_broadcast.h"
#include "../collectives/ring_allgather.h"
#include "../reduce/reduce.h"

namespace horovodlike {

void Executor::Execute(const Response& response) {
  std::vector<TensorEntry> entries;
  for (const std::string& name : response.names) {
    TensorEntry entry;
    if (!queue_.Take(name, &entry)) {
      throw TransportError("internal error: negotiated tensor '" + name +
                           "' has no local entry");
    }
    entries.push_back(std::move(entry));
  }
  if (response.type == Response::Type::kError) {
    ++errors_;
    for (auto& e : entries) {
      handles_.Complete(e.handle, Status::Error(StatusCode::kMismatch, response.error_message));
    }
    return;
  }
  try {
    switch (response.type) {
      case Response::Type::kAllreduce: Allreduce(response, entries); break;
      case Response::Type::kAllgather: Allgather(response, entries.at(0)); break;
      case Response::Type::kBroadcast: Broadcast(response, entries.at(0)); break;
      case Response::Type::kBarrier:
      case Response::Type::kError: break;
    }
  } catch (const TransportError& e) {
    for (auto& entry : entries) {
      handles_.Complete(entry.handle, Status::Error(StatusCode::kInternal, e.what()));
    }
    throw;
  }
  for (auto& entry : entries) handles_.Complete(entry.handle, Status::Ok());
}

void Executor::Allreduce(const Response& response, std::vector<TensorEntry>& entries) {
  const DataType dtype = response.dtype;
  const size_t elem = DataTypeSize(dtype);
  ++allreduce_collectives_;
  allreduce_tensors_ += static_cast<int64_t>(entries.size());
  double postscale = response.postscale;
  if (response.reduce_op == ReduceOp::kAverage) postscale /= transport_.size();

  if (entries.size() == 1) {
    // One tensor: reduce straight in its output, no fusion-buffer copies.
    TensorEntry& e = entries[0];
    const size_t count = static_cast<size_t>(NumElements(e.request.shape));
    if (e.input != e.output) {
      ScaleCopy(e.output, e.input, count, dtype, response.prescale);
    } else {
      ScaleInPlace(e.output, count, dtype, response.prescale);
    }
    Reduce(e.output, count, dtype, response.reduce_op);
    ScaleInPlace(e.output, count, dtype, postscale);
    return;
  }
  size_t total = 0;
  for (auto& e : entries) total += static_cast<size_t>(NumElements(e.request.shape));
  uint8_t* buffer = fusion_.Reserve(total * elem);
  size_t offset = 0;
  for (auto& e : entries) {
    const size_t count = static_cast<size_t>(NumElements(e.request.shape));
    ScaleCopy(buffer + offset * elem, e.input, count, dtype, response.prescale);
    offset += count;
  }
  Reduce(buffer, total, dtype, response.reduce_op);
  offset = 0;
  for (auto& e : entries) {
    const size_t count = static_cast<size_t>(NumElements(e.request.shape));
    ScaleCopy(e.output, buffer + offset * elem, count, dtype, postscale);
    offset += count;
  }
}

void Executor::Reduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (transport_.size() == 1 || count == 0) return;
  if (!transport_.NativeAllreduce(buf, count, dtype, op)) {
    ring_.Run(transport_, buf, count, dtype, op);
  }
}

void Executor::Allgather(const Response& response, TensorEntry& entry) {
  const auto& shape = entry.request.shape;
  const size_t row_bytes =
      static_cast<size_t>(NumElements(std::vector<int64_t>(shape.begin() + 1, shape.end()))) *
      DataTypeSize(response.dtype);
  const int n = transport_.size();
  std::vector<size_t> block_bytes(n);
  size_t offset = 0, total_rows = 0;
  for (int r = 0; r < n; ++r) {
    block_bytes[r] = static_cast<size_t>(response.first_dims[r]) * row_bytes;
    if (r < transport_.rank()) offset += block_bytes[r];
    total_rows += static_cast<size_t>(response.first_dims[r]);
  }
  HandleState& state = *entry.handle;
  state.output.resize(total_rows * row_bytes);
  state.output_shape = shape;
  state.output_shape[0] = static_cast<int64_t>(total_rows);
  state.first_dims = response.first_dims;
  if (block_bytes[transport_.rank()] > 0) {
    std::memcpy(state.output.data() + offset, entry.input, block_bytes[transport_.rank()]);
  }
  RingAllgatherv(transport_, state.output.data(), block_bytes);
}

void Executor::Broadcast(const Response& response, TensorEntry& entry) {
  const size_t bytes = static_cast<size_t>(NumElements(entry.request.shape)) *
                       DataTypeSize(response.dtype);
  if (transport_.rank() == response.root_rank && entry.input != entry.output && bytes > 0) {
    std::memcpy(entry.output, entry.input, bytes);
  }
  ChainBroadcast(transport_, entry.output, bytes, response.root_rank);
}

}  // namespace horovodlike
