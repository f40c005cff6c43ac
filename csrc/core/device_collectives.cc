#include "device_collectives.h"

#include <unistd.h>

#include <cstring>

#include "../collectives/chain_broadcast.h"
#include "../collectives/provider_table.h"
#include "../links/host_hierarchy.h"
#include "../reduce/reduce.h"
#include "../common/logging.h"
#include "../cuda/device_context.h"
#include "tensor_layout.h"
#include "../common/backend_names.h"

namespace horovodlike {
namespace {

// Timeline and run-count labels of NCCL's collectives.
const char* const kNcclAllreduce = "NCCL_ALLREDUCE";
const char* const kNcclByHost = "NCCL_HIERARCHICAL_ALLREDUCE";
const char* const kNcclAllgather = "NCCL_ALLGATHER";
const char* const kNcclReducescatter = "NCCL_REDUCESCATTER";
const char* const kNcclAlltoall = "NCCL_ALLTOALL";
const char* const kNcclBroadcast = "NCCL_BROADCAST";
const char* const kStaged = "CUDA_HOST_STAGING";

// What each rank tells the others before the set's first GPU collective.
struct RankReport {
  char host[64];
  char bus_id[32];
  int32_t nccl_usable;
  int32_t device;
};

size_t Bytes(const TensorEntry& e, size_t elem) {
  return static_cast<size_t>(NumElements(e.request.shape)) * elem;
}



class Activity {
 public:
  Activity(Timeline& timeline, const char* label) : timeline_(timeline) {
    timeline_.ActivityStart(label);
    ProviderTable::CountRun(label);
  }
  ~Activity() { timeline_.ActivityEnd(); }

 private:
  Timeline& timeline_;
};

}  // namespace

std::string DeviceCollectives::mode() const {
  switch (mode_) {
    case Mode::kNccl: return kGpuNccl;
    case Mode::kStaged: return "staged: " + reason_;
    case Mode::kRefused: return "refused: " + reason_;
    case Mode::kUndecided: break;
  }
  return "";
}

void DeviceCollectives::Execute(const Response* const* parts, size_t count,
                                std::vector<TensorEntry>& entries, const Host& host) {
  const Response& response = *parts[0];
  // This rank's GPU: its tensors' (a rank that joined has none here: the set's so far).
  int device = -1;
  for (const TensorEntry& e : entries) {
    if (e.request.device < 0) continue;
    if (device >= 0 && e.request.device != device) {
      throw InvalidArgument("'" + e.request.name + "' is on GPU " +
                            std::to_string(e.request.device) + " and '" + entries[0].request.name +
                            "' on GPU " + std::to_string(device) +
                            ": the tensors of one collective must be on one GPU");
    }
    device = e.request.device;
  }
  if (device < 0) device = device_;
  if (device < 0) Cuda().Check(Cuda().GetDevice(&device), "cudaGetDevice");
  if (device_ < 0) device_ = device;
  DeviceContext& context = DeviceContext::For(device);
  for (const TensorEntry& e : entries) {
    if (e.ready_event) context.StreamWait(e.ready_event.get());
  }
  if (mode_ == Mode::kUndecided) Decide(context, host);
  if (mode_ == Mode::kRefused) throw InvalidArgument(reason_);

  GpuCompletions::Pending pending;
  if (mode_ == Mode::kNccl && NcclRuns(response)) {
    switch (response.type) {
      case Response::Type::kAllreduce: Allreduce(context, response, entries); break;
      case Response::Type::kAllgather: Allgather(context, parts, entries); break;
      case Response::Type::kReducescatter: Reducescatter(context, response, entries); break;
      case Response::Type::kAlltoall: Alltoall(context, response, entries.at(0)); break;
      case Response::Type::kBroadcast: Broadcast(context, response, entries.at(0)); break;
      default: throw InvalidArgument("internal error: not a GPU collective");
    }
    pending.nccl = nccl_;
    for (auto& memory : keep_) pending.keep.push_back(std::move(memory));
    keep_.clear();
  } else {
    Staged(context, response, entries, host, &pending);
  }
  pending.event = context.RecordOn(context.stream());
  for (TensorEntry& e : entries) {
    if (!e.handle) continue;
    e.handle->device = device;
    e.handle->completion_event = pending.event;
    e.handle->caller_stream = e.stream;
    pending.handles.push_back(e.handle);
  }
  completions_.Add(std::move(pending));
}

void DeviceCollectives::Adopt(std::shared_ptr<NcclCollectives> nccl) {
  nccl_ = std::move(nccl);
  device_ = nccl_->device().device();
  mode_ = Mode::kNccl;
  completions_.Watch(nccl_);
}

void DeviceCollectives::Decide(DeviceContext& device, const Host& host) {
  const CudaApi& cuda = device.cuda();
  std::vector<RankReport> reports(size_);
  RankReport& mine = reports[rank_];
  std::memset(&mine, 0, sizeof(mine));
  // Ranks on one machine may be different hosts to the launcher (and to the hierarchy).
  if (!host_.empty()) {
    std::snprintf(mine.host, sizeof(mine.host), "%s", host_.c_str());
  } else {
    gethostname(mine.host, sizeof(mine.host) - 1);
  }
  if (cuda.DeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id) - 1, device.device()) !=
      kCudaSuccess) {
    std::snprintf(mine.bus_id, sizeof(mine.bus_id), "device %d", device.device());
  }
  mine.nccl_usable = gpu_operations_ == kGpuStaged ? 0 : NcclUsable();
  mine.device = device.device();
  if (size_ > 1) host.allgather(reports.data(), std::vector<size_t>(size_, sizeof(RankReport)));
  std::string why;
  if (AsksForStaging(gpu_operations_)) {
    why = "HOROVOD_GPU_OPERATIONS=" + gpu_operations_;
  }
  for (int r = 0; r < size_ && why.empty(); ++r) {
    if (!reports[r].nccl_usable) {
      why = "NCCL is not usable on rank " + std::to_string(r) +
            (r == rank_ ? " (" + NcclStatus().error + ")" : "");
    }
  }
  for (int r = 0; r < size_ && why.empty(); ++r) {
    for (int q = r + 1; q < size_ && why.empty(); ++q) {
      if (std::strcmp(reports[r].host, reports[q].host) == 0 &&
          std::strcmp(reports[r].bus_id, reports[q].bus_id) == 0) {
        why = "ranks " + std::to_string(r) + " and " + std::to_string(q) + " share the GPU " +
              reports[r].bus_id + " of " + reports[r].host + " (NCCL takes one rank per GPU)";
      }
    }
  }
  if (why.empty()) {
    nccl_ = std::make_shared<NcclCollectives>(
        device, rank_, size_, [&](void* bytes, size_t n) { host.broadcast(bytes, n, 0); });
    completions_.Watch(nccl_);
    mode_ = Mode::kNccl;
    return;
  }
  reason_ = why;
  if (gpu_operations_ == kGpuNccl) {
    mode_ = Mode::kRefused;
    reason_ = "HOROVOD_GPU_OPERATIONS=nccl asks for NCCL, but " + why +
              "; unset it to stage GPU tensors through host memory";
    return;
  }
  mode_ = Mode::kStaged;
  if (rank_ == 0) HVDL_LOG(kInfo, "GPU tensors are staged through host memory: " << why);
}

bool DeviceCollectives::NcclRuns(const Response& response) const {
  const double scale = response.prescale * response.postscale;
  switch (response.type) {
    case Response::Type::kAllreduce:
    case Response::Type::kReducescatter:
      // An integer tensor is scaled twice, each time truncated, as on the host (and as
      // Horovod's kernels do): pre * post in one step would round differently.
      if (!IsFloatingPoint(response.dtype) &&
          (response.prescale != 1.0 || response.postscale != 1.0)) {
        return false;
      }
      return nccl_->CanReduce(response.dtype, response.reduce_op, scale);
    default:
      return true;
  }
}

void DeviceCollectives::Staged(DeviceContext& device, const Response& response,
                               std::vector<TensorEntry>& entries, const Host& host,
                               GpuCompletions::Pending* pending) {
  Activity activity(timeline_, kStaged);
  const size_t elem = DataTypeSize(response.dtype);
  const bool writes_output =
      response.type == Response::Type::kAllreduce || response.type == Response::Type::kBroadcast;
  struct Back {
    void* device_output;
    uint8_t* host_output;
    size_t bytes;
  };
  std::vector<Back> back;
  for (TensorEntry& e : entries) {
    if (e.input == nullptr) continue;  // a joined rank's share: the host path makes it
    const size_t bytes = Bytes(e, elem);
    std::shared_ptr<uint8_t> host_input = device.Pinned(bytes);
    device.Copy(host_input.get(), e.input, bytes, kDeviceToHost);
    if (writes_output && e.output != nullptr) {
      uint8_t* host_output = host_input.get();
      if (e.output != e.input) {
        std::shared_ptr<uint8_t> separate = device.Pinned(bytes);
        host_output = separate.get();
        pending->keep.push_back(std::move(separate));
      }
      back.push_back({e.output, host_output, bytes});
      e.output = host_output;
    }
    e.input = host_input.get();
    pending->keep.push_back(std::move(host_input));
  }
  device.Synchronize();  // the inputs are in host memory
  host.run_collective();
  for (const Back& b : back) device.Copy(b.device_output, b.host_output, b.bytes, kHostToDevice);
}

void DeviceCollectives::Allreduce(DeviceContext& device, const Response& response,
                                  std::vector<TensorEntry>& entries) {
  const bool by_host = ByHost(response);
  Activity activity(timeline_, by_host ? kNcclByHost : kNcclAllreduce);
  const DataType dtype = response.dtype;
  const size_t elem = DataTypeSize(dtype);
  const double scale = response.prescale * response.postscale;
  auto reduce = [&](const void* in, void* out, size_t count) {
    if (!by_host) {
      nccl_->Allreduce(in, out, count, dtype, response.reduce_op, scale);
      return;
    }
    if (in != out) device.Copy(out, in, count * elem, kDeviceToDevice);
    AllreduceByHost(device, response, out, count);
  };
  if (entries.size() == 1 && entries[0].input != nullptr) {
    TensorEntry& e = entries[0];
    reduce(e.input, e.output, Bytes(e, elem) / elem);
    return;
  }
  // Fused through the device's buffer (a joined rank's share is zeros).
  size_t total = 0;
  for (const TensorEntry& e : entries) total += Bytes(e, elem);
  uint8_t* buffer = device.FusionBuffer(total);
  size_t offset = 0;
  for (const TensorEntry& e : entries) {
    const size_t bytes = Bytes(e, elem);
    if (e.input != nullptr) {
      device.Copy(buffer + offset, e.input, bytes, kDeviceToDevice);
    } else {
      device.Zero(buffer + offset, bytes);
    }
    offset += bytes;
  }
  reduce(buffer, buffer, total / elem);
  offset = 0;
  for (const TensorEntry& e : entries) {
    const size_t bytes = Bytes(e, elem);
    if (e.output != nullptr) device.Copy(e.output, buffer + offset, bytes, kDeviceToDevice);
    offset += bytes;
  }
}

bool DeviceCollectives::ByHost(const Response& response) const {
  if (hosts_ == nullptr || !hosts_->allreduce()) return false;
  // Hosts of different sizes, or ranks not numbered host by host: the flat NCCL allreduce.
  if (!hosts_->uniform() || !hosts_->contiguous() || hosts_->local() == nullptr ||
      hosts_->cross() == nullptr) {
    return false;
  }
  // The scale is applied across hosts, in host memory: only to sums.
  const ReduceOp op = response.reduce_op;
  const bool scaled = response.prescale * response.postscale != 1.0 || op == ReduceOp::kAverage;
  return !scaled || op == ReduceOp::kSum || op == ReduceOp::kAverage;
}

void DeviceCollectives::AllreduceByHost(DeviceContext& device, const Response& response,
                                        void* buffer, size_t count) {
  const HostHierarchy& hosts = *hosts_;
  ShmLink& local = *hosts.local();
  const int local_size = local.size();
  const int local_rank = hosts.local_rank();
  if (!host_nccl_) {
    host_nccl_ = std::make_shared<NcclCollectives>(
        device, local_rank, local_size,
        [&](void* bytes, size_t n) { ChainBroadcast(local, bytes, n, 0); });
    completions_.Watch(host_nccl_);
  }
  const DataType dtype = response.dtype;
  const size_t elem = DataTypeSize(dtype);
  const ReduceOp op =
      response.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : response.reduce_op;
  std::vector<size_t> block_counts(local_size), block_bytes(local_size);
  size_t offset = 0;
  for (int r = 0; r < local_size; ++r) {
    block_counts[r] = count / local_size + (static_cast<size_t>(r) < count % local_size ? 1 : 0);
    block_bytes[r] = block_counts[r] * elem;
    if (r < local_rank) offset += block_bytes[r];
  }
  const size_t mine = block_bytes[local_rank];
  if (scratch_bytes_ < mine) {
    device.Synchronize();  // the old scratch may still be in use
    scratch_ = device.DeviceMemory(mine);
    scratch_bytes_ = mine;
  }
  host_nccl_->ReduceScatter(buffer, scratch_.get(), block_counts, dtype, op, 1.0);
  std::shared_ptr<uint8_t> host = device.Pinned(mine);
  device.Copy(host.get(), scratch_.get(), mine, kDeviceToHost);
  device.Synchronize();
  if (mine > 0) {
    cross_ring_.Run(*hosts.cross(), host.get(), block_counts[local_rank], dtype, op);
    double factor = response.prescale * response.postscale;
    if (response.reduce_op == ReduceOp::kAverage) factor /= size_;
    ScaleInPlace(host.get(), block_counts[local_rank], dtype, factor);
  }
  uint8_t* out = static_cast<uint8_t*>(buffer);
  device.Copy(out + offset, host.get(), mine, kHostToDevice);
  keep_.push_back(std::move(host));
  host_nccl_->Allgather(out, block_bytes);
}

void DeviceCollectives::Allgather(DeviceContext& device, const Response* const* parts,
                                  std::vector<TensorEntry>& entries) {
  Activity activity(timeline_, kNcclAllgather);
  const Response& response = *parts[0];
  const size_t k = entries.size();
  const int n = size_;
  auto rows = [&](size_t t, int r) { return static_cast<size_t>(parts[t]->first_dims[r]); };
  std::vector<size_t> row_bytes(k), block_bytes(n, 0), total_rows(k, 0);
  for (size_t t = 0; t < k; ++t) {
    row_bytes[t] = RowBytes(entries[t].request.shape, response.dtype);
    for (int r = 0; r < n; ++r) {
      block_bytes[r] += rows(t, r) * row_bytes[t];
      total_rows[t] += rows(t, r);
    }
  }
  std::vector<size_t> block_offset(n + 1, 0);
  for (int r = 0; r < n; ++r) block_offset[r + 1] = block_offset[r] + block_bytes[r];
  const size_t total = block_offset[n];
  for (size_t t = 0; t < k; ++t) {
    HandleState& state = *entries[t].handle;
    state.output_shape = entries[t].request.shape;
    state.output_shape[0] = static_cast<int64_t>(total_rows[t]);
    state.integers = parts[t]->first_dims;
    state.device_output_bytes = total_rows[t] * row_bytes[t];
    state.device_output = device.DeviceMemory(state.device_output_bytes);
  }
  if (k == 1) {
    HandleState& state = *entries[0].handle;
    uint8_t* out = state.device_output.get();
    device.Copy(out + block_offset[rank_], entries[0].input, block_bytes[rank_], kDeviceToDevice);
    nccl_->Allgather(out, block_bytes);
    return;
  }
  // Fused: each rank's block holds its rows of every tensor in turn.
  uint8_t* buffer = device.FusionBuffer(total);
  size_t offset = block_offset[rank_];
  for (size_t t = 0; t < k; ++t) {
    const size_t bytes = rows(t, rank_) * row_bytes[t];
    device.Copy(buffer + offset, entries[t].input, bytes, kDeviceToDevice);
    offset += bytes;
  }
  nccl_->Allgather(buffer, block_bytes);
  std::vector<size_t> out_offset(k, 0);
  for (int r = 0; r < n; ++r) {
    size_t in = block_offset[r];
    for (size_t t = 0; t < k; ++t) {
      const size_t bytes = rows(t, r) * row_bytes[t];
      device.Copy(entries[t].handle->device_output.get() + out_offset[t], buffer + in, bytes,
                  kDeviceToDevice);
      in += bytes;
      out_offset[t] += bytes;
    }
  }
}

void DeviceCollectives::Reducescatter(DeviceContext& device, const Response& response,
                                      std::vector<TensorEntry>& entries) {
  Activity activity(timeline_, kNcclReducescatter);
  const int n = size_;
  const DataType dtype = response.dtype;
  const size_t elem = DataTypeSize(dtype);
  const size_t k = entries.size();
  const ScatterLayout layout = LayReducescatter(entries, dtype, n);
  const std::vector<size_t>& row_elems = layout.row_elems;
  const std::vector<size_t>& block_counts = layout.block_counts;
  const size_t total = layout.total;
  // The input laid out rank-major (block r: rank r's rows of every tensor in turn), then this
  // rank's reduced block.
  uint8_t* buffer = device.FusionBuffer((total + block_counts[rank_]) * elem);
  const uint8_t* input = buffer;
  if (k == 1) {
    input = static_cast<const uint8_t*>(entries[0].input);
  } else {
    size_t offset = 0;
    std::vector<size_t> consumed(k, 0);
    for (int r = 0; r < n; ++r) {
      for (size_t t = 0; t < k; ++t) {
        const size_t count =
            static_cast<size_t>(ScatterRows(entries[t].request.shape[0], r, n)) * row_elems[t];
        device.Copy(buffer + offset * elem,
                    static_cast<const uint8_t*>(entries[t].input) + consumed[t] * elem,
                    count * elem, kDeviceToDevice);
        offset += count;
        consumed[t] += count;
      }
    }
  }
  uint8_t* result = buffer + total * elem;
  nccl_->ReduceScatter(input, result, block_counts, dtype, response.reduce_op,
                       response.prescale * response.postscale);
  size_t offset = 0;
  for (size_t t = 0; t < k; ++t) {
    HandleState& state = *entries[t].handle;
    const int64_t my_rows = ScatterRows(entries[t].request.shape[0], rank_, n);
    const size_t bytes = static_cast<size_t>(my_rows) * row_elems[t] * elem;
    state.output_shape = entries[t].request.shape;
    state.output_shape[0] = my_rows;
    state.device_output_bytes = bytes;
    state.device_output = device.DeviceMemory(bytes);
    device.Copy(state.device_output.get(), result + offset, bytes, kDeviceToDevice);
    offset += bytes;
  }
}

void DeviceCollectives::Alltoall(DeviceContext& device, const Response& response,
                                 TensorEntry& entry) {
  Activity activity(timeline_, kNcclAlltoall);
  const int n = size_;
  const size_t row_bytes = RowBytes(entry.request.shape, response.dtype);
  AlltoallLayout layout = LayAlltoall(response, rank_, n, row_bytes);
  HandleState& state = *entry.handle;
  state.output_shape = entry.request.shape;
  state.output_shape[0] = layout.total_rows;
  state.device_output_bytes = static_cast<size_t>(layout.total_rows) * row_bytes;
  state.device_output = device.DeviceMemory(state.device_output_bytes);
  nccl_->Alltoall(entry.input, layout.send_bytes, state.device_output.get(), layout.recv_bytes);
  state.integers = std::move(layout.received);
}

void DeviceCollectives::Broadcast(DeviceContext& device, const Response& response,
                                  TensorEntry& entry) {
  Activity activity(timeline_, kNcclBroadcast);
  const size_t bytes = Bytes(entry, DataTypeSize(response.dtype));
  if (rank_ == response.root_rank && entry.input != entry.output) {
    device.Copy(entry.output, entry.input, bytes, kDeviceToDevice);
  }
  nccl_->Broadcast(entry.output, bytes, response.root_rank);
}

}  // namespace horovodlike
