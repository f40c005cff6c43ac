// Types shared by every layer of the core: dtypes, reduce ops, status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace horovodlike {

// The Python layers take these numbers (and the names below) from the extension
// (csrc/python/module.cc, horovodlike/common/constants.py); the wire format carries them too.
enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
  // Appended, not next to kInt16, so that the numbers above keep their meaning.
  kUInt16 = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Adaptive summation of gradients (collectives/adasum_allreduce.h); allreduce only.
  kAdasum = 5,
};
constexpr int kNumReduceOps = 6;

enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kAlltoall = 4,
  kReducescatter = 5,
  kJoin = 6,
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
};
constexpr int kNumOpTypes = 9;
// Join and process-set changes: control operations, which carry no tensor (core/message.h).
inline bool IsControlOp(OpType op) {
  return op == OpType::kJoin || op == OpType::kAddProcessSet || op == OpType::kRemoveProcessSet;
}

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);
bool IsValidDataType(int32_t value);
bool IsFloatingPoint(DataType dtype);

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,   // bad input found before anything was sent
  kMismatch = 2,          // ranks disagreed about a tensor; the job goes on
  kInternal = 3,          // a peer broke or the link failed; the runtime stopped
  kShutdown = 4,          // shutdown() was called while the operation was pending
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  static Status Ok() { return {}; }
  static Status Error(StatusCode c, std::string m) { return {c, std::move(m)}; }
  bool ok() const { return code == StatusCode::kOk; }
};

// Thrown for a broken link or peer; turned into StatusCode::kInternal by the loop.
// `peer` is the job rank that caused it when known (-1 otherwise), so that the launcher can
// tell the rank that failed first from the ranks that failed because of it.
class TransportError : public std::runtime_error {
 public:
  // kInterrupted: a signal handler on the waiting thread raised (common/interrupt.h).
  enum class Cause { kOther, kPeerLost, kPeerTimeout, kStall, kInterrupted };
  explicit TransportError(const std::string& what, int peer = -1, Cause cause = Cause::kOther)
      : std::runtime_error(what), peer_(peer), cause_(cause) {}
  int peer() const { return peer_; }
  Cause cause() const { return cause_; }

 private:
  int peer_;
  Cause cause_;
};

// Thrown synchronously to the caller of enqueue for bad input (becomes ValueError).
class InvalidArgument : public std::invalid_argument {
 public:
  explicit InvalidArgument(const std::string& what) : std::invalid_argument(what) {}
};

int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace horovodlike
