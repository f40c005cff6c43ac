#include "executor.h"

#include <cstring>

#include "tensor_layout.h"
#include "../reduce/reduce.h"

namespace horovodlike {

void Executor::Prepare(size_t parts, size_t fused_bytes) {
  fusion_.Expect(fused_bytes);
  entries_.reserve(parts);
  adasum_counts_.reserve(parts);
  row_bytes_.reserve(parts);
  out_offset_.reserve(parts);
}

uint64_t Executor::StageEarly(const Response& response) {
  staged_provider_ = nullptr;
  if (link_.size() == 1 || response.type != Response::Type::kAllreduce ||
      response.device >= 0 || response.tensor_sizes.size() != 1 || response.names.size() != 1) {
    return 0;
  }
  const size_t count = static_cast<size_t>(response.tensor_sizes[0]);
  if (count == 0) return 0;
  const auto chosen = providers_->Allreduce(count, response.dtype, response.reduce_op);
  void* slot = chosen.provider->StagingFor(count, response.dtype, response.reduce_op);
  if (slot == nullptr) return 0;
  QueueKey(process_set_id_, response.names[0], &key_);
  const void* input = queue_.HostInput(key_);
  if (input == nullptr) return 0;
  ScaleCopy(slot, input, count, response.dtype, response.prescale);
  const uint64_t token = chosen.provider->Staged();
  if (token != 0) staged_provider_ = chosen.provider;
  return token;
}

void Executor::Execute(const Response* const* parts, size_t count, uint64_t staged) {
  staged_ = staged;
  size_t tensor_bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    tensor_bytes += static_cast<size_t>(NumElements(parts[i]->shape)) *
                    DataTypeSize(parts[i]->dtype);
  }
  fusion_.CollectiveStarted(tensor_bytes);
  const Response& response = *parts[0];
  std::vector<TensorEntry>& entries = entries_;
  entries.clear();
  for (size_t i = 0; i < count; ++i) {
    const std::string& name = parts[i]->names.at(0);
    entries.emplace_back();
    TensorEntry& entry = entries.back();
    QueueKey(process_set_id_, name, &key_);
    if (!queue_.Take(key_, &entry)) {
      // A joined rank has no entry for an error response either (a collective other ranks
      // started after it joined): it only counts the error, as every rank does.
      if (response.type != Response::Type::kAllreduce &&
          response.type != Response::Type::kError) {
        throw TransportError("internal error: negotiated tensor '" + name +
                             "' has no local entry");
      }
      // This rank has joined: it takes part with zeros and keeps nothing.
      entry.request.name = name;
      if (response.type == Response::Type::kAllreduce) {
        entry.request.shape = {parts[i]->tensor_sizes.at(0)};
      }
    }
  }
  // Completes every handle and lets go of the entries (the vector keeps its storage).
  auto complete = [&](Status status) {
    timeline_.OperationEnd();
    for (auto& e : entries) {
      if (e.handle) handles_.Complete(e.handle, status);
    }
    entries.clear();
  };
  if (response.type == Response::Type::kError) {
    ++errors_;
    complete(Status::Error(StatusCode::kMismatch, response.error_message));
    return;
  }
  timeline_.OperationStart(parts, count);
  try {
    if (response.device >= 0 && OnDevice(response.type)) {
      ExecuteOnDevice(parts, count, entries);
      // The handles are GpuCompletions' now: completed when the GPU work is done.
      timeline_.OperationEnd();
      entries.clear();
      return;
    }
    RunOnHost(parts, count, entries);
  } catch (const TransportError& e) {
    // The loop stops on this: the entries go back to the queue and fail with everything else,
    // with the loop's account of what happened (which may name the rank that failed first).
    for (auto& entry : entries) {
      if (!entry.handle) continue;
      auto handle = entry.handle;
      try {
        queue_.Add(std::move(entry));
      } catch (const std::exception&) {
        handles_.Complete(handle, Status::Error(StatusCode::kInternal, e.what()));
      }
    }
    throw;
  } catch (const InvalidArgument& e) {
    complete(Status::Error(StatusCode::kInvalidArgument, e.what()));
    return;
  }
  complete(Status::Ok());
}

bool Executor::OnDevice(Response::Type type) {
  switch (type) {
    case Response::Type::kAllreduce:
    case Response::Type::kAllgather:
    case Response::Type::kBroadcast:
    case Response::Type::kAlltoall:
    case Response::Type::kReducescatter:
      return true;
    default:
      return false;
  }
}

void Executor::RunOnHost(const Response* const* parts, size_t count,
                         std::vector<TensorEntry>& entries) {
  const Response& response = *parts[0];
  switch (response.type) {
    case Response::Type::kAllreduce: Allreduce(response, entries); break;
    case Response::Type::kAllgather: Allgather(parts, entries); break;
    case Response::Type::kReducescatter: Reducescatter(response, entries); break;
    case Response::Type::kAlltoall: Alltoall(response, entries.at(0)); break;
    case Response::Type::kBroadcast: Broadcast(response, entries.at(0)); break;
    case Response::Type::kJoin:
      entries.at(0).handle->integers = {response.control.last_joined_rank};
      break;
    case Response::Type::kAddProcessSet:
    case Response::Type::kRemoveProcessSet:
      entries.at(0).handle->integers = {on_process_set_change_(response)};
      break;
    case Response::Type::kBarrier:
    case Response::Type::kError:
      break;
  }
}

void Executor::AdoptNccl(std::shared_ptr<NcclCollectives> nccl) {
  device_ = std::make_unique<DeviceCollectives>(link_.rank(), link_.size(),
                                                gpu_settings_, *gpu_, timeline_);
  device_->Adopt(std::move(nccl));
}

void Executor::ExecuteOnDevice(const Response* const* parts, size_t count,
                               std::vector<TensorEntry>& entries) {
  if (gpu_ == nullptr) {
    throw InvalidArgument("'" + parts[0]->names.at(0) + "' is in GPU memory, but this process "
                          "set has no GPU path");
  }
  if (!device_) {
    device_ = std::make_unique<DeviceCollectives>(link_.rank(), link_.size(),
                                                  gpu_settings_, *gpu_, timeline_);
  }
  DeviceCollectives::Host host;
  host.run_collective = [&] { RunOnHost(parts, count, entries); };
  host.allgather = [&](void* out, const std::vector<size_t>& block_bytes) {
    Gather(out, block_bytes);
  };
  host.broadcast = [&](void* buf, size_t bytes, int root) {
    if (link_.size() > 1) providers_->Broadcast().provider->Run(buf, bytes, root);
  };
  device_->Execute(parts, count, entries, host);
}

void Executor::Reduce(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) {
  if (count == 0) return;
  if (link_.size() == 1) {
    ScaleInPlace(buf, count, dtype, scale);
    return;
  }
  const auto chosen = providers_->Allreduce(count, dtype, op);
  timeline_.ActivityStart(chosen.label);
  const uint64_t staged = staged_;
  staged_ = 0;
  if (staged != 0 && chosen.provider == staged_provider_) {
    if (chosen.provider->RunStaged(buf, count, dtype, op, scale, staged)) ++early_staged_;
  } else {
    chosen.provider->Run(buf, count, dtype, op, scale);
  }
  ProviderTable::CountRun(chosen.label);
  if (chosen.by_host) ++hierarchical_allreduces_;
  timeline_.ActivityEnd();
}

void Executor::ReduceAdasum(void* buf, const size_t* counts, size_t num_tensors, DataType dtype,
                            double scale, const std::string& tensor) {
  size_t total = 0;
  for (size_t t = 0; t < num_tensors; ++t) total += counts[t];
  if (total == 0) return;
  if (link_.size() > 1) {
    const auto chosen = providers_->Adasum();
    timeline_.ActivityStart(chosen.label);
    chosen.provider->Run(buf, counts, num_tensors, dtype, tensor);
    ProviderTable::CountRun(chosen.label);
    timeline_.ActivityEnd();
  }
  ScaleInPlace(buf, total, dtype, scale);
}

void Executor::Gather(void* out, const std::vector<size_t>& block_bytes) {
  const auto chosen = providers_->Allgather();
  timeline_.ActivityStart(chosen.label);
  chosen.provider->Run(out, block_bytes);
  ProviderTable::CountRun(chosen.label);
  if (chosen.by_host) ++hierarchical_allgathers_;
  timeline_.ActivityEnd();
}

void Executor::Allreduce(const Response& response, std::vector<TensorEntry>& entries) {
  const DataType dtype = response.dtype;
  const size_t elem = DataTypeSize(dtype);
  ++allreduce_collectives_;
  allreduce_tensors_ += static_cast<int64_t>(entries.size());
  double postscale = response.postscale;
  if (response.reduce_op == ReduceOp::kAverage) postscale /= link_.size();
  // Adasum is scaled as Sum is: it is not averaged (as in Horovod).
  const bool adasum = response.reduce_op == ReduceOp::kAdasum;
  auto count_of = [](const TensorEntry& e) {
    return static_cast<size_t>(NumElements(e.request.shape));
  };
  // Reduced straight in its output, without the copies in and out of the fusion buffer: the
  // only tensor of a response, or a large one (there the two copies cost more than a
  // collective of its own). Decided from sizes alone, so every rank runs the same collectives
  // in the same order: first the small tensors packed together, then each large one.
  auto direct = [&](const TensorEntry& e) {
    return entries.size() == 1 || count_of(e) * elem >= FusionBuffer::kDirectAllreduceBytes;
  };

  size_t total = 0;
  for (auto& e : entries) total += direct(e) ? 0 : count_of(e);
  if (total > 0) {
    uint8_t* buffer = fusion_.Reserve(total * elem);
    size_t offset = 0;
    timeline_.ActivityStart("MEMCPY_IN_FUSION_BUFFER");
    for (auto& e : entries) {
      if (direct(e)) continue;
      const size_t count = count_of(e);
      if (e.input != nullptr) {
        ScaleCopy(buffer + offset * elem, e.input, count, dtype, response.prescale);
      } else {
        std::memset(buffer + offset * elem, 0, count * elem);  // a joined rank's share
      }
      offset += count;
    }
    timeline_.ActivityEnd();
    if (adasum) {
      // Each fused tensor keeps its own dot products, so Adasum needs the boundaries.
      adasum_counts_.clear();
      const std::string* first_name = nullptr;
      for (auto& e : entries) {
        if (direct(e)) continue;
        adasum_counts_.push_back(count_of(e));
        if (first_name == nullptr) first_name = &e.request.name;
      }
      ReduceAdasum(buffer, adasum_counts_.data(), adasum_counts_.size(), dtype, 1.0,
                   *first_name);
    } else {
      Reduce(buffer, total, dtype, response.reduce_op, 1.0);
    }
    offset = 0;
    timeline_.ActivityStart("MEMCPY_OUT_FUSION_BUFFER");
    for (auto& e : entries) {
      if (direct(e)) continue;
      const size_t count = count_of(e);
      if (e.output != nullptr) ScaleCopy(e.output, buffer + offset * elem, count, dtype, postscale);
      offset += count;
    }
    timeline_.ActivityEnd();
  }
  for (auto& e : entries) {
    if (!direct(e)) continue;
    const size_t count = count_of(e);
    if (e.output == nullptr) {
      // A joined rank takes part with zeros and keeps nothing; with the same scale as the
      // others, since a backend may scale the parts of the result this rank computes.
      uint8_t* zeros = fusion_.Reserve(count * elem);
      std::memset(zeros, 0, count * elem);
      if (adasum) {
        ReduceAdasum(zeros, &count, 1, dtype, postscale, e.request.name);
      } else {
        Reduce(zeros, count, dtype, response.reduce_op, postscale);
      }
      continue;
    }
    if (e.input != e.output) {
      ScaleCopy(e.output, e.input, count, dtype, response.prescale);
    } else {
      ScaleInPlace(e.output, count, dtype, response.prescale);
    }
    if (adasum) {
      ReduceAdasum(e.output, &count, 1, dtype, postscale, e.request.name);
    } else {
      Reduce(e.output, count, dtype, response.reduce_op, postscale);
    }
  }
}

void Executor::Allgather(const Response* const* parts, std::vector<TensorEntry>& entries) {
  const Response& response = *parts[0];
  const int n = link_.size();
  const int rank = link_.rank();
  const size_t k = entries.size();
  // Each part's first_dims: every rank's rows of that tensor.
  auto rows = [&](size_t t, int r) { return static_cast<size_t>(parts[t]->first_dims[r]); };
  std::vector<size_t>& row_bytes = row_bytes_;
  std::vector<size_t>& block_bytes = block_bytes_;
  row_bytes.assign(k, 0);
  block_bytes.assign(n, 0);
  for (size_t t = 0; t < k; ++t) {
    row_bytes[t] = RowBytes(entries[t].request.shape, response.dtype);
    for (int r = 0; r < n; ++r) block_bytes[r] += rows(t, r) * row_bytes[t];
  }
  for (size_t t = 0; t < k; ++t) {
    HandleState& state = *entries[t].handle;
    size_t total_rows = 0;
    for (int r = 0; r < n; ++r) total_rows += rows(t, r);
    state.output.resize(total_rows * row_bytes[t]);
    state.output_shape = entries[t].request.shape;
    state.output_shape[0] = static_cast<int64_t>(total_rows);
    state.integers = parts[t]->first_dims;
  }
  if (k == 1) {
    // Straight into the output: blocks are already in rank order.
    HandleState& state = *entries[0].handle;
    size_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += block_bytes[r];
    if (block_bytes[rank] > 0) {
      std::memcpy(state.output.data() + offset, entries[0].input, block_bytes[rank]);
    }
    Gather(state.output.data(), block_bytes);
    return;
  }
  // Fused: each rank's block holds its rows of every tensor in turn.
  size_t total = 0;
  std::vector<size_t>& block_offset = block_offset_;
  block_offset.assign(n + 1, 0);
  for (int r = 0; r < n; ++r) block_offset[r + 1] = block_offset[r] + block_bytes[r];
  total = block_offset[n];
  uint8_t* buffer = fusion_.Reserve(total);
  size_t offset = block_offset[rank];
  timeline_.ActivityStart("MEMCPY_IN_FUSION_BUFFER");
  for (size_t t = 0; t < k; ++t) {
    const size_t bytes = rows(t, rank) * row_bytes[t];
    if (bytes > 0) std::memcpy(buffer + offset, entries[t].input, bytes);
    offset += bytes;
  }
  timeline_.ActivityEnd();
  Gather(buffer, block_bytes);
  timeline_.ActivityStart("MEMCPY_OUT_FUSION_BUFFER");
  std::vector<size_t>& out_offset = out_offset_;
  out_offset.assign(k, 0);
  for (int r = 0; r < n; ++r) {
    size_t in = block_offset[r];
    for (size_t t = 0; t < k; ++t) {
      const size_t bytes = rows(t, r) * row_bytes[t];
      if (bytes > 0) std::memcpy(entries[t].handle->output.data() + out_offset[t], buffer + in, bytes);
      in += bytes;
      out_offset[t] += bytes;
    }
  }
  timeline_.ActivityEnd();
}

void Executor::Reducescatter(const Response& response, std::vector<TensorEntry>& entries) {
  const int n = link_.size();
  const int rank = link_.rank();
  const DataType dtype = response.dtype;
  const size_t elem = DataTypeSize(dtype);
  const size_t k = entries.size();
  double postscale = response.postscale;
  if (response.reduce_op == ReduceOp::kAverage) postscale /= n;
  const ScatterLayout layout = LayReducescatter(entries, dtype, n);
  const std::vector<size_t>& row_elems = layout.row_elems;
  const std::vector<size_t>& block_counts = layout.block_counts;
  const size_t total = layout.total;
  // Work buffer laid out rank-major: block r holds rank r's rows of every tensor in turn.
  uint8_t* buffer = fusion_.Reserve(total * elem);
  size_t offset = 0;
  std::vector<size_t> consumed(k, 0);  // elements of tensor t already packed
  timeline_.ActivityStart("MEMCPY_IN_FUSION_BUFFER");
  for (int r = 0; r < n; ++r) {
    for (size_t t = 0; t < k; ++t) {
      const size_t count =
          static_cast<size_t>(ScatterRows(entries[t].request.shape[0], r, n)) * row_elems[t];
      ScaleCopy(buffer + offset * elem,
                static_cast<const uint8_t*>(entries[t].input) + consumed[t] * elem, count, dtype,
                response.prescale);
      offset += count;
      consumed[t] += count;
    }
  }
  timeline_.ActivityEnd();
  const auto chosen = providers_->Reducescatter();
  timeline_.ActivityStart(chosen.label);
  chosen.provider->Run(buffer, block_counts, dtype, response.reduce_op);
  ProviderTable::CountRun(chosen.label);
  timeline_.ActivityEnd();
  timeline_.ActivityStart("MEMCPY_OUT_FUSION_BUFFER");
  offset = 0;
  for (int r = 0; r < rank; ++r) offset += block_counts[r];
  for (size_t t = 0; t < k; ++t) {
    HandleState& state = *entries[t].handle;
    const int64_t my_rows = ScatterRows(entries[t].request.shape[0], rank, n);
    const size_t count = static_cast<size_t>(my_rows) * row_elems[t];
    state.output.resize(count * elem);
    state.output_shape = entries[t].request.shape;
    state.output_shape[0] = my_rows;
    if (count > 0) ScaleCopy(state.output.data(), buffer + offset * elem, count, dtype, postscale);
    offset += count;
  }
  timeline_.ActivityEnd();
}

void Executor::Alltoall(const Response& response, TensorEntry& entry) {
  const int n = link_.size();
  const int rank = link_.rank();
  const size_t row_bytes = RowBytes(entry.request.shape, response.dtype);
  AlltoallLayout layout = LayAlltoall(response, rank, n, row_bytes);
  const std::vector<size_t>& send_bytes = layout.send_bytes;
  const std::vector<size_t>& recv_bytes = layout.recv_bytes;
  HandleState& state = *entry.handle;
  state.output.resize(static_cast<size_t>(layout.total_rows) * row_bytes);
  state.output_shape = entry.request.shape;
  state.output_shape[0] = layout.total_rows;
  state.integers = std::move(layout.received);
  const auto chosen = providers_->Alltoall();
  timeline_.ActivityStart(chosen.label);
  chosen.provider->Run(entry.input, send_bytes, state.output.data(), recv_bytes);
  ProviderTable::CountRun(chosen.label);
  timeline_.ActivityEnd();
}

void Executor::Broadcast(const Response& response, TensorEntry& entry) {
  const size_t bytes = static_cast<size_t>(NumElements(entry.request.shape)) *
                       DataTypeSize(response.dtype);
  if (link_.rank() == response.root_rank && entry.input != entry.output && bytes > 0) {
    std::memcpy(entry.output, entry.input, bytes);
  }
  const auto chosen = providers_->Broadcast();
  timeline_.ActivityStart(chosen.label);
  chosen.provider->Run(entry.output, bytes, response.root_rank);
  ProviderTable::CountRun(chosen.label);
  timeline_.ActivityEnd();
}

}  // namespace horovodlike
