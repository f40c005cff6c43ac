// MPI_Allreduce (its non-blocking form) as an allreduce provider, for small messages over the
// MPI link. Compiled only when CMake finds MPI.
#include "mpi_allreduce.h"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "../../reduce/reduce.h"

namespace horovodlike {
namespace {

// User ops reducing float16 and bfloat16 with our kernels, created once per process (MPI frees
// them at MPI_Finalize), indexed by HalfOpIndex().
std::once_flag g_half_ops_once;
std::vector<MPI_Op> g_half_ops;

int HalfOpIndex(DataType dtype, ReduceOp op) {
  return (dtype == DataType::kFloat16 ? 0 : 4) + (static_cast<int>(op) - 1);
}

template <DataType kType, ReduceOp kOp>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, static_cast<size_t>(*len), kType, kOp);
}

template <DataType kType>
void CreateHalfOps() {
  MPI_User_function* functions[] = {&HalfReduce<kType, ReduceOp::kSum>,
                                    &HalfReduce<kType, ReduceOp::kMin>,
                                    &HalfReduce<kType, ReduceOp::kMax>,
                                    &HalfReduce<kType, ReduceOp::kProduct>};
  for (MPI_User_function* f : functions) {
    MPI_Op op;
    MPI_Op_create(f, /*commute=*/1, &op);
    g_half_ops.push_back(op);
  }
}

// MPI's own type and op for a reduction, or false when MPI has none (float16, bfloat16 use
// the user ops above).
bool MpiTypeAndOp(DataType dtype, ReduceOp op, MPI_Datatype* type, MPI_Op* mpi_op) {
  if (op == ReduceOp::kAdasum) return false;  // not elementwise; the executor runs it
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    *type = MPI_UINT16_T;
    *mpi_op = g_half_ops[HalfOpIndex(dtype, op == ReduceOp::kAverage ? ReduceOp::kSum : op)];
    return true;
  }
  if (dtype == DataType::kBool) {
    *type = MPI_C_BOOL;
    *mpi_op = (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? MPI_LAND : MPI_LOR;
    return true;
  }
  switch (dtype) {
    // 8- and 16-bit integers stay on the ring: Open MPI 4.1.4's AVX reductions (op/avx)
    // saturate their sums (100 + 100 gives 127 in int8) where C and NumPy wrap around.
    case DataType::kInt32: *type = MPI_INT32_T; break;
    case DataType::kInt64: *type = MPI_INT64_T; break;
    case DataType::kFloat32: *type = MPI_FLOAT; break;
    case DataType::kFloat64: *type = MPI_DOUBLE; break;
    default: return false;
  }
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: *mpi_op = MPI_SUM; break;
    case ReduceOp::kMin: *mpi_op = MPI_MIN; break;
    case ReduceOp::kMax: *mpi_op = MPI_MAX; break;
    case ReduceOp::kProduct: *mpi_op = MPI_PROD; break;
    default: return false;
  }
  return true;
}

}  // namespace

// By default MPI's allreduce is used up to kSmallMessageBytes, where latency rules and its
// algorithms take fewer steps than the ring's 2(n - 1). Above it the ring over point-to-point,
// which overlaps the reduction with the transfer, was 2-3x faster at 16-64 MiB (Open MPI 4.1.4,
// 2 ranks, shared memory; benchmarks/ should refine this).
MpiAllreduce::MpiAllreduce(MpiLink& link, bool every_size)
    : link_(link), max_bytes_(every_size ? SIZE_MAX : kSmallMessageBytes) {
  std::call_once(g_half_ops_once, [] {
    CreateHalfOps<DataType::kFloat16>();
    CreateHalfOps<DataType::kBFloat16>();
  });
}

bool MpiAllreduce::Supports(size_t count, DataType dtype, ReduceOp op) const {
  MPI_Datatype type;
  MPI_Op mpi_op;
  return count * DataTypeSize(dtype) <= max_bytes_ && MpiTypeAndOp(dtype, op, &type, &mpi_op);
}

void MpiAllreduce::Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) {
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (!MpiTypeAndOp(dtype, op, &type, &mpi_op)) {
    throw InvalidArgument(std::string("MPI_Allreduce has no operation for ") +
                          DataTypeName(dtype));
  }
  link_.CheckUsable();
  // The non-blocking form, so that a peer's abort notice or a timeout ends the wait. A
  // collective cannot be cancelled, and an abandoned one may still complete later: it works
  // on a copy that the link keeps once abandoned, not on the caller's memory.
  const size_t bytes = count * DataTypeSize(dtype);
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  std::memcpy(scratch_.data(), buf, bytes);
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Iallreduce(MPI_IN_PLACE, scratch_.data(), static_cast<int>(count), type, mpi_op,
                     link_.comm(), &request) != MPI_SUCCESS) {
    throw TransportError("MPI error in MPI_Iallreduce");
  }
  link_.AwaitCollective(request, "MPI_Iallreduce", scratch_);
  ScaleCopy(buf, scratch_.data(), count, dtype, scale);
}

}  // namespace horovodlike
