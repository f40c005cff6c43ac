#include "common.h"

#include <sstream>

namespace horovodlike {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kInt16: case DataType::kUInt16: case DataType::kFloat16: case DataType::kBFloat16: return 2;
    case DataType::kInt32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kFloat64: return 8;
  }
  throw InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
    case ReduceOp::kAdasum: return "Adasum";
  }
  return "unknown";
}

const char* OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kBarrier: return "barrier";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kJoin: return "join";
    case OpType::kAddProcessSet: return "add_process_set";
    case OpType::kRemoveProcessSet: return "remove_process_set";
  }
  return "unknown";
}

bool IsValidDataType(int32_t value) { return value >= 0 && value < kNumDataTypes; }

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

}  // namespace horovodlike
