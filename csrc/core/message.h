// What ranks tell the coordinator (Request) and what it tells them back (Response),
// and their wire format. The decoder checks every length against the bytes it was given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace horovodlike {

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

  // True when the two requests ask for the same collective with the same parameters.
  bool SameParameters(const Request& other) const;
};

struct Response {
  enum class Type : int32_t { kAllreduce = 0, kAllgather = 1, kBroadcast = 2, kBarrier = 3,
                              kError = 4 };
  Type type = Type::kAllreduce;
  std::vector<std::string> names;  // several when fused
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  int32_t device = -1;
  std::vector<int64_t> first_dims;  // allgather: the first dimension of each rank's tensor
  int64_t total_bytes = 0;          // allreduce: bytes of all its tensors, for fusion
  std::string error_message;
};

class WireWriter {
 public:
  void PutI32(int32_t v);
  void PutI64(int64_t v);
  void PutF64(double v);
  void PutString(const std::string& s);
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
