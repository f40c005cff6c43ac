// NCCL, loaded at run time like the CUDA runtime (cuda_api.h): its ABI declared here, the
// symbols resolved one at a time, and the features of newer versions gated on ncclGetVersion
// (an older NCCL works with what it has).
#pragma once

#include <string>

#include "cuda_api.h"

namespace horovodlike {

using ncclResult_t = int;
using ncclComm_t = void*;
using ncclDataType_t = int;
using ncclRedOp_t = int;
struct ncclUniqueId {
  char internal[128];
};

constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclInProgress = 7;
enum NcclDataType : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4,
  kNcclUint64 = 5, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9
};
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };
constexpr int kNcclScalarHostImmediate = 1;
constexpr int kNcclSplitNoColor = -1;

struct NcclApi {
  std::string path;
  int version = 0;          // NCCL's code, e.g. 22305 for 2.23.5
  std::string version_name;  // "2.23.5"
  bool has_avg = false;      // ncclAvg, 2.10
  bool has_premulsum = false;  // ncclRedOpCreatePreMulSum, 2.11
  bool has_split = false;    // ncclCommSplit, 2.18

  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t*, void*) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int,
                         ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t*, void*, ncclDataType_t, int,
                                       ncclComm_t) = nullptr;
  ncclResult_t (*RedOpDestroy)(ncclRedOp_t, ncclComm_t) = nullptr;

  // Throws TransportError("<what>: <NCCL's message>") when `result` is not success.
  void Check(ncclResult_t result, const char* what) const;
  std::string ErrorString(ncclResult_t result) const;
};

// The oldest NCCL the core works with: grouped ncclSend/ncclRecv came in 2.7.
constexpr int kMinNcclVersion = 20700;

GpuLibraryStatus NcclStatus();
// The loaded library; throws InvalidArgument naming the file, what it lacks or its version.
const NcclApi& Nccl();
// Whether Nccl() would succeed.
bool NcclUsable();

}  // namespace horovodlike
