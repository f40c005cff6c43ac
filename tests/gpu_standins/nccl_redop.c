/* The stand-in NCCL's reduction operations: the built-in ones, ncclAvg (gated by the
 * version), and PreMulSum operations a communicator creates, resolved for each call. */
#include "nccl_internal.h"

#include <stdlib.h>
#include <string.h>

/* Resolves the user's op into op->red and its scalar. */
ncclResult_t resolve_op(struct coll* op, int user_op, const char* name) {
  struct ncclComm* c = op->comm;
  op->user_op = user_op;
  memset(op->scalar, 0, sizeof op->scalar);
  op->scalar_ptr = NULL;
  switch (user_op) {
    case OP_SUM: op->red = R_SUM; return ncclSuccess;
    case OP_PROD: op->red = R_PROD; return ncclSuccess;
    case OP_MAX: op->red = R_MAX; return ncclSuccess;
    case OP_MIN: op->red = R_MIN; return ncclSuccess;
    case OP_AVG:
      if (g_version < 21000)
        return fail(ncclInvalidArgument, "%s: ncclAvg needs NCCL 2.10 (this is %d)", name,
                    g_version);
      if (is_float(op->dtype)) {
        op->red = R_PREMUL;
        avg_scalar(op->dtype, c->nranks, op->scalar);
      } else {
        op->red = R_SUMDIV;
      }
      return ncclSuccess;
  }
  if (user_op < OP_FIRST_USER)
    return fail(ncclInvalidArgument, "%s: invalid reduction operation %d", name, user_op);
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&c->mu);
  int ix = user_op - OP_FIRST_USER;
  if (ix >= c->nops || !c->ops[ix].used) {
    rc = fail(ncclInvalidArgument, "%s: reduction operation %d unknown to this communicator",
              name, user_op);
  } else if (c->ops[ix].dtype != op->dtype) {
    rc = fail(ncclInvalidArgument, "%s: reduction operation %d was created for datatype %d, not %d",
              name, user_op, c->ops[ix].dtype, op->dtype);
  } else {
    op->red = R_PREMUL;
    if (c->ops[ix].residence == 1)
      memcpy(op->scalar, c->ops[ix].value, sizeof op->scalar);
    else
      op->scalar_ptr = c->ops[ix].ptr;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EXPORT ncclResult_t ncclRedOpCreatePreMulSum(int* op, void* scalar, int dtype, int residence,
                                             ncclComm_t comm) {
  settings();
  if (g_version < 21100)
    return fail(ncclInvalidUsage, "ncclRedOpCreatePreMulSum needs NCCL 2.11 (this is %d)",
                g_version);
  if (!comm_valid(comm))
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: comm is not a live communicator");
  if (!op || !scalar) return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: NULL argument");
  if (dtype < 0 || dtype >= T_NUM)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid type %d", dtype);
  if (residence != 0 && residence != 1)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid residence %d", residence);
  pthread_mutex_lock(&comm->mu);
  int ix = 0;
  while (ix < comm->nops && comm->ops[ix].used) ix++;
  if (ix == comm->nops) {
    struct user_op* p = realloc(comm->ops, (size_t)(comm->nops + 1) * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&comm->mu);
      return fail(ncclSystemError, "out of memory");
    }
    comm->ops = p;
    comm->nops++;
  }
  struct user_op* u = &comm->ops[ix];
  memset(u, 0, sizeof *u);
  u->used = 1;
  u->dtype = dtype;
  u->residence = residence;
  if (residence == 1)
    memcpy(u->value, scalar, g_type_size[dtype]);
  else
    u->ptr = scalar;
  pthread_mutex_unlock(&comm->mu);
  *op = OP_FIRST_USER + ix;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpDestroy(int op, ncclComm_t comm) {
  if (!comm_valid(comm))
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: comm is not a live communicator");
  if (op < OP_FIRST_USER)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: %d is a built-in operation", op);
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&comm->mu);
  int ix = op - OP_FIRST_USER;
  if (ix >= comm->nops || !comm->ops[ix].used)
    rc = fail(ncclInvalidArgument, "ncclRedOpDestroy: operation %d unknown to this communicator",
              op);
  else
    comm->ops[ix].used = 0;
  pthread_mutex_unlock(&comm->mu);
  return rc;
}
