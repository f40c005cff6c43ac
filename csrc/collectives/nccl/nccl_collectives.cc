#include "nccl_collectives.h"

#include <cmath>
#include <cstring>

#include "../../reduce/half.h"

namespace horovodlike {
namespace {

// NCCL's type for ours; -1: none (int16, uint16). Bool reduces as uint8 (see MakeOp).
int NcclType(DataType dtype, const NcclApi& nccl) {
  switch (dtype) {
    case DataType::kUInt8: return kNcclUint8;
    case DataType::kBool: return kNcclUint8;
    case DataType::kInt8: return kNcclInt8;
    case DataType::kInt32: return kNcclInt32;
    case DataType::kInt64: return kNcclInt64;
    case DataType::kFloat16: return kNcclFloat16;
    case DataType::kBFloat16: return nccl.version >= 21000 ? kNcclBfloat16 : -1;
    case DataType::kFloat32: return kNcclFloat32;
    case DataType::kFloat64: return kNcclFloat64;
    default: return -1;
  }
}

// Keeps the core's stream's device current while NCCL calls run.
struct Scoped {
  explicit Scoped(DeviceContext& d) : guard(d.cuda(), d.device()) {}
  DeviceGuard guard;
};

}  // namespace

NcclCollectives::NcclCollectives(DeviceContext& device, int rank, int size,
                                 const BroadcastBytes& broadcast_id)
    : nccl_(Nccl()), device_(device), rank_(rank), size_(size) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) nccl_.Check(nccl_.GetUniqueId(&id), "ncclGetUniqueId");
  broadcast_id(&id, sizeof(id));
  Scoped scoped(device_);
  nccl_.Check(nccl_.CommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
}

NcclCollectives::NcclCollectives(DeviceContext& device, ncclComm_t comm, int rank, int size)
    : nccl_(Nccl()), device_(device), comm_(comm), rank_(rank), size_(size) {}

NcclCollectives::~NcclCollectives() {
  if (comm_ == nullptr) return;
  // A communicator that failed is aborted (destroying it would wait for work that never ends).
  if (aborted_) return;
  if (!AsyncError().empty()) {
    Abort();
    return;
  }
  nccl_.CommDestroy(comm_);
}

std::unique_ptr<NcclCollectives> NcclCollectives::Split(NcclCollectives& parent, bool member,
                                                        int key, int new_rank, int new_size) {
  const NcclApi& nccl = parent.nccl_;
  ncclComm_t comm = nullptr;
  Scoped scoped(parent.device_);
  nccl.Check(nccl.CommSplit(parent.comm_, member ? 0 : kNcclSplitNoColor, key, &comm, nullptr),
             "ncclCommSplit");
  if (!member) return nullptr;
  return std::make_unique<NcclCollectives>(parent.device_, comm, new_rank, new_size);
}

bool NcclCollectives::CanReduce(DataType dtype, ReduceOp op, double scale) const {
  if (NcclType(dtype, nccl_) < 0) return false;
  if (scale != 1.0 && OneRankScalingBroken()) return false;
  const bool floating = IsFloatingPoint(dtype);
  switch (op) {
    case ReduceOp::kSum:
      if (dtype == DataType::kBool) return scale == 1.0;
      return scale == 1.0 || (floating && nccl_.has_premulsum);
    case ReduceOp::kAverage:
      if (!floating) return false;
      return (scale == 1.0 && nccl_.has_avg) || nccl_.has_premulsum;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      return scale == 1.0;
    default:
      return false;  // Adasum
  }
}

ncclRedOp_t NcclCollectives::MakeOp(DataType dtype, ReduceOp op, double scale, bool* created) {
  *created = false;
  if (dtype == DataType::kBool) {
    // Logical or / and over 0 and 1.
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) return kNcclMax;
    return kNcclMin;
  }
  switch (op) {
    case ReduceOp::kMin: return kNcclMin;
    case ReduceOp::kMax: return kNcclMax;
    case ReduceOp::kProduct: return kNcclProd;
    default: break;
  }
  if (op == ReduceOp::kSum && scale == 1.0) return kNcclSum;
  if (op == ReduceOp::kAverage && scale == 1.0 && OneRankScalingBroken()) return kNcclSum;
  if (op == ReduceOp::kAverage && scale == 1.0 && nccl_.has_avg) return kNcclAvg;
  // NCCL multiplies each rank's input by the scalar before summing (PreMulSum).
  const double factor = op == ReduceOp::kAverage ? scale / size_ : scale;
  union {
    double f64;
    float f32;
    uint16_t bits16;
  } scalar;
  std::memset(&scalar, 0, sizeof(scalar));
  switch (dtype) {
    case DataType::kFloat64: scalar.f64 = factor; break;
    case DataType::kFloat32: scalar.f32 = static_cast<float>(factor); break;
    case DataType::kFloat16:
      scalar.bits16 = half_internal::FloatToHalfBits(static_cast<float>(factor));
      break;
    case DataType::kBFloat16:
      scalar.bits16 = half_internal::FloatToBFloat16Bits(static_cast<float>(factor));
      break;
    default: throw InvalidArgument("internal error: no NCCL scaling for this dtype");
  }
  ncclRedOp_t made = 0;
  nccl_.Check(nccl_.RedOpCreatePreMulSum(&made, &scalar, NcclType(dtype, nccl_),
                                         kNcclScalarHostImmediate, comm_),
              "ncclRedOpCreatePreMulSum");
  *created = true;
  return made;
}

void NcclCollectives::ReleaseOp(ncclRedOp_t op, bool created) {
  if (created) nccl_.RedOpDestroy(op, comm_);
}

void NcclCollectives::Allreduce(const void* in, void* out, size_t count, DataType dtype,
                                ReduceOp op, double scale) {
  if (count == 0) return;
  Scoped scoped(device_);
  bool created = false;
  const ncclRedOp_t nccl_op = MakeOp(dtype, op, scale, &created);
  const ncclResult_t result = nccl_.AllReduce(in, out, count, NcclType(dtype, nccl_), nccl_op,
                                              comm_, device_.stream());
  ReleaseOp(nccl_op, created);
  nccl_.Check(result, "ncclAllReduce");
}

void NcclCollectives::ReduceScatter(const void* in, void* out,
                                    const std::vector<size_t>& block_counts, DataType dtype,
                                    ReduceOp op, double scale) {
  Scoped scoped(device_);
  const size_t elem = DataTypeSize(dtype);
  bool even = true;
  for (size_t c : block_counts) even = even && c == block_counts[0];
  bool created = false;
  const ncclRedOp_t nccl_op = MakeOp(dtype, op, scale, &created);
  const int type = NcclType(dtype, nccl_);
  ncclResult_t result = kNcclSuccess;
  if (even) {
    if (block_counts[0] > 0) {
      result = nccl_.ReduceScatter(in, out, block_counts[0], type, nccl_op, comm_,
                                   device_.stream());
    }
  } else {
    // Uneven blocks: one reduce to each block's rank, run as one group.
    nccl_.Check(nccl_.GroupStart(), "ncclGroupStart");
    size_t offset = 0;
    for (int r = 0; r < size_ && result == kNcclSuccess; ++r) {
      if (block_counts[r] > 0) {
        result = nccl_.Reduce(static_cast<const uint8_t*>(in) + offset * elem, out,
                              block_counts[r], type, nccl_op, r, comm_, device_.stream());
      }
      offset += block_counts[r];
    }
    const ncclResult_t end = nccl_.GroupEnd();
    if (result == kNcclSuccess) result = end;
  }
  ReleaseOp(nccl_op, created);
  nccl_.Check(result, "ncclReduceScatter");
}

void NcclCollectives::Allgather(void* out, const std::vector<size_t>& block_bytes) {
  Scoped scoped(device_);
  bool even = true;
  size_t total = 0;
  for (size_t b : block_bytes) {
    even = even && b == block_bytes[0];
    total += b;
  }
  if (total == 0) return;
  uint8_t* base = static_cast<uint8_t*>(out);
  if (even) {
    nccl_.Check(nccl_.AllGather(base + rank_ * block_bytes[0], base, block_bytes[0], kNcclUint8,
                                comm_, device_.stream()),
                "ncclAllGather");
    return;
  }
  // Uneven blocks: every rank broadcasts its block, as one group.
  nccl_.Check(nccl_.GroupStart(), "ncclGroupStart");
  ncclResult_t result = kNcclSuccess;
  size_t offset = 0;
  for (int r = 0; r < size_ && result == kNcclSuccess; ++r) {
    if (block_bytes[r] > 0) {
      result = nccl_.Broadcast(base + offset, base + offset, block_bytes[r], kNcclUint8, r, comm_,
                               device_.stream());
    }
    offset += block_bytes[r];
  }
  const ncclResult_t end = nccl_.GroupEnd();
  nccl_.Check(result != kNcclSuccess ? result : end, "ncclBroadcast (allgather)");
}

void NcclCollectives::Alltoall(const void* in, const std::vector<size_t>& send_bytes, void* out,
                               const std::vector<size_t>& recv_bytes) {
  Scoped scoped(device_);
  nccl_.Check(nccl_.GroupStart(), "ncclGroupStart");
  ncclResult_t result = kNcclSuccess;
  size_t send_offset = 0, recv_offset = 0;
  for (int r = 0; r < size_ && result == kNcclSuccess; ++r) {
    if (send_bytes[r] > 0) {
      result = nccl_.Send(static_cast<const uint8_t*>(in) + send_offset, send_bytes[r],
                          kNcclUint8, r, comm_, device_.stream());
    }
    if (result == kNcclSuccess && recv_bytes[r] > 0) {
      result = nccl_.Recv(static_cast<uint8_t*>(out) + recv_offset, recv_bytes[r], kNcclUint8, r,
                          comm_, device_.stream());
    }
    send_offset += send_bytes[r];
    recv_offset += recv_bytes[r];
  }
  const ncclResult_t end = nccl_.GroupEnd();
  nccl_.Check(result != kNcclSuccess ? result : end, "ncclSend/ncclRecv (alltoall)");
}

void NcclCollectives::Broadcast(void* buf, size_t bytes, int root) {
  if (bytes == 0) return;
  Scoped scoped(device_);
  nccl_.Check(nccl_.Broadcast(buf, buf, bytes, kNcclUint8, root, comm_, device_.stream()),
              "ncclBroadcast");
}

std::string NcclCollectives::AsyncError() {
  if (comm_ == nullptr || aborted_) return "";
  ncclResult_t error = kNcclSuccess;
  const ncclResult_t result = nccl_.CommGetAsyncError(comm_, &error);
  if (result != kNcclSuccess) return nccl_.ErrorString(result);
  if (error != kNcclSuccess && error != kNcclInProgress) return nccl_.ErrorString(error);
  return "";
}

void NcclCollectives::Abort() {
  if (comm_ == nullptr || aborted_.exchange(true)) return;
  nccl_.CommAbort(comm_);
}

}  // namespace horovodlike
