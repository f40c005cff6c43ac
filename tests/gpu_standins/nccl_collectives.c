/* The stand-in NCCL's collectives and point-to-point calls: the arguments checked (buffers
 * against the stand-in runtime's memory table), then the op issued. */
#include "nccl_internal.h"

static ncclResult_t check_buffer(const void* p, size_t bytes, const char* what, const char* name) {
  if (bytes == 0 || !standin_cuda_ptr_kind) return ncclSuccess;
  int kind = standin_cuda_ptr_kind(p, bytes);
  if (kind == 1 || kind == 2) return ncclSuccess;
  if (kind < 0)
    return fail(ncclInvalidArgument, "%s: %s %p + %zu bytes runs past its allocation", name, what,
                p, bytes);
  return fail(ncclInvalidArgument, "%s: %s %p is not device memory", name, what, p);
}

static ncclResult_t common_checks(struct coll* op, const char* name) {
  settings();
  ncclResult_t rc = check_comm(op->comm, name);
  if (rc) return rc;
  if (op->dtype < 0 || op->dtype >= T_NUM)
    return fail(ncclInvalidArgument, "%s: invalid type %d", name, op->dtype);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, int dtype,
                                  int op, ncclComm_t comm, void* stream) {
  const char* name = "ncclAllReduce";
  struct coll c = {.kind = K_ALLREDUCE, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = -1};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc) rc = resolve_op(&c, op, name);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, int dtype,
                               int op, int root, ncclComm_t comm, void* stream) {
  const char* name = "ncclReduce";
  struct coll c = {.kind = K_REDUCE, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = root};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (root < 0 || root >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid root %d", name, root);
  if (!rc) rc = resolve_op(&c, op, name);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc && comm->rank == root) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, int dtype,
                                  int root, ncclComm_t comm, void* stream) {
  const char* name = "ncclBroadcast";
  struct coll c = {.kind = K_BROADCAST, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = root};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (root < 0 || root >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid root %d", name, root);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc && comm->rank == root) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}

#ifndef STANDIN_NCCL_OMIT_ALLGATHER
EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                  int dtype, ncclComm_t comm, void* stream) {
  const char* name = "ncclAllGather";
  struct coll c = {.kind = K_ALLGATHER, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = sendcount, .dtype = dtype, .peer = -1};
  ncclResult_t rc = common_checks(&c, name);
  size_t nb = sendcount * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb * (size_t)comm->nranks, "recvbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}
#endif

EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                      int dtype, int op, ncclComm_t comm, void* stream) {
  const char* name = "ncclReduceScatter";
  struct coll c = {.kind = K_REDUCESCATTER, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = recvcount, .dtype = dtype, .peer = -1};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc) rc = resolve_op(&c, op, name);
  size_t nb = recvcount * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb * (size_t)comm->nranks, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, int dtype, int peer,
                             ncclComm_t comm, void* stream) {
  const char* name = "ncclSend";
  struct coll c = {.kind = K_SEND, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = NULL,
                   .count = count, .dtype = dtype, .peer = peer};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (peer < 0 || peer >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid peer %d", name, peer);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, int dtype, int peer, ncclComm_t comm,
                             void* stream) {
  const char* name = "ncclRecv";
  struct coll c = {.kind = K_RECV, .comm = comm, .stream = stream,
                   .sendbuff = NULL, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = peer};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (peer < 0 || peer >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid peer %d", name, peer);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}
