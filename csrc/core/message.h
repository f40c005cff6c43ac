// What ranks tell the coordinator (Request) and what it tells them back (Response),
// and their wire format. The decoder checks every length against the bytes it was given.
//
// Two kinds of message share the negotiation, so that every rank applies them at the same
// point in the order of operations: collectives over a tensor, and control operations (join,
// add/remove_process_set; IsControlOp). A control operation carries a ControlRequest /
// ControlResponse and none of the tensor fields; on the wire it is written as its own record
// after the common header (rank or names, op), never as a tensor with fields put to other use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../common/common.h"

namespace horovodlike {

// The longest string a message carries (a tensor name, an error text): the decoder refuses a
// longer one as a corrupt stream. So the runtime refuses longer names before anything is sent
// (enqueue_checks.h), and texts that quote names are clipped when written (PutText).
constexpr int64_t kMaxWireStringBytes = int64_t{1} << 20;

// Join: nothing. add_process_set: the new set's ranks. remove_process_set: the set's id.
struct ControlRequest {
  std::vector<int32_t> ranks;
  int32_t process_set_id = -1;
  bool operator==(const ControlRequest& other) const {
    return ranks == other.ranks && process_set_id == other.process_set_id;
  }
};

// Join: the last rank to join. add_process_set: the agreed ranks (the id is given out by each
// rank's process-set table, in the same order everywhere). remove_process_set: the set's id.
struct ControlResponse {
  std::vector<int32_t> ranks;
  int32_t process_set_id = -1;
  int32_t last_joined_rank = -1;
};

struct Request {
  int32_t rank = 0;
  OpType op = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  int32_t device = -1;  // -1: host memory
  std::vector<int64_t> splits;  // alltoall: rows sent to each rank
  int64_t group_id = 0;         // grouped ops: members share an id (0: not grouped)
  int32_t group_size = 0;
  ControlRequest control;       // control operations only (IsControlOp(op))

  // True when the two requests ask for the same collective with the same parameters.
  bool SameParameters(const Request& other) const;
};

struct Response {
  // The same numbering as OpType, plus kError.
  enum class Type : int32_t { kAllreduce = 0, kAllgather = 1, kBroadcast = 2, kBarrier = 3,
                              kAlltoall = 4, kReducescatter = 5, kJoin = 6,
                              kAddProcessSet = 7, kRemoveProcessSet = 8, kError = 9 };
  Type type = Type::kAllreduce;
  std::vector<std::string> names;  // several when fused
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  int32_t device = -1;
  std::vector<int64_t> first_dims;  // allgather: each rank's first dimension
  // alltoall: the n x n matrix of rows rank i sends to rank j (row-major)
  std::vector<int64_t> alltoall_rows;
  std::vector<int64_t> shape;         // a single tensor's shape (all ranks agree on it)
  std::vector<int64_t> tensor_sizes;  // allreduce: elements of each tensor in `names`
  int64_t total_bytes = 0;            // allreduce: bytes of all its tensors, for fusion
  int64_t group_id = 0;   // members of a grouped call run together, fused
  int32_t group_size = 0;
  std::string error_message;
  ControlResponse control;  // kJoin, kAddProcessSet, kRemoveProcessSet only
};

class WireWriter {
 public:
  void PutI32(int32_t v);
  void PutI64(int64_t v);
  void PutF64(double v);
  void PutString(const std::string& s);
  // A text for people (an error, a stall report): one over kMaxWireStringBytes loses its middle
  // (cut at UTF-8 character boundaries), so that a long name quoted in it never makes the
  // message unreadable.
  void PutText(const std::string& s);
  void PutI64Vector(const std::vector<int64_t>& v);
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  void Put(const void* p, size_t n);
  std::vector<uint8_t> bytes_;
};

class WireReader {
 public:
  WireReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int32_t GetI32();
  int64_t GetI64();
  double GetF64();
  std::string GetString();
  std::vector<int64_t> GetI64Vector();
  bool done() const { return pos_ == size_; }

 private:
  void Get(void* p, size_t n);
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Encoders append to the writer; decoders throw TransportError on malformed input.
void EncodeRequests(const std::vector<Request>& requests, WireWriter& out);
std::vector<Request> DecodeRequests(const uint8_t* data, size_t size);
void EncodeResponses(const std::vector<Response>& responses, WireWriter& out);
std::vector<Response> DecodeResponses(const uint8_t* data, size_t size);

}  // namespace horovodlike
