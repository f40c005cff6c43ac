// The interface every collective is written against. Blocking, point-to-point, full duplex.
// Between two ranks the bytes form one ordered stream: a send need not be matched by a receive of
// the same size (a collective may send a whole chunk while its peer receives it in segments), so
// a backend with message semantics (MPI, Gloo) must buffer or split to honour this.
#pragma once

#include <cstddef>

#include "../core/common.h"

namespace horovodlike {

class HostHierarchy;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Each call moves exactly n bytes or throws TransportError.
  virtual void send(int peer, const void* buf, size_t n) = 0;
  virtual void recv(int peer, void* buf, size_t n) = 0;
  // Sends to `to` while receiving from `from`; never deadlocks when both sides call it at once.
  virtual void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) = 0;
  // Closes every connection; pending and later calls throw TransportError.
  virtual void abort() = 0;
  // A backend's own allreduce algorithm (MPI_Allreduce, a shared-memory reduction...), in place
  // over all ranks of this transport, Average reduced as Sum, the result multiplied by `scale`
  // (1: unscaled) as it is written, which saves a pass over the buffer; every rank passes the
  // same scale, as a rank may compute the result for the others. Returns false when the
  // backend has none for these arguments (nothing done); the ring over send/recv is used then.
  virtual bool NativeAllreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                               double scale) {
    return false;
  }
  // The ranks grouped by host, when this transport spans several hosts and the job asked for
  // hierarchical collectives (host_hierarchy.h); null otherwise. The same on every rank: either
  // all have one or none has.
  virtual const HostHierarchy* hierarchy() const { return nullptr; }
  // Short name for logs and --check-build ("tcp", "shm+tcp", "mpi", "gloo").
  virtual const char* name() const { return "unknown"; }
};

}  // namespace horovodlike
