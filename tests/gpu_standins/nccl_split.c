/* The stand-in NCCL's ncclCommSplit: the ranks exchange (color, key) on the parent's wire,
 * and each color's ranks form a new communicator, ordered by (key, parent rank). */
#include "nccl_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Waits for the comm's queued work, then does the exchange on the comm's wire under its lock
 * (no stream op can interleave). */
static ncclResult_t exchange_split(struct ncclComm* c, int color, int key, int32_t* all) {
  pthread_mutex_lock(&c->mu);
  while (c->pending > 0 && !c->async_error && !atomic_load(&c->aborted))
    pthread_cond_wait(&c->cv, &c->mu);
  int err = c->async_error;
  pthread_mutex_unlock(&c->mu);
  if (err) return fail(err, "ncclCommSplit: the parent communicator has an error (%d)", err);
  int n = c->nranks, r = c->rank;
  all[2 * r] = color;
  all[2 * r + 1] = key;
  if (n == 1) return ncclSuccess;
  struct plan P;
  memset(&P, 0, sizeof P);
  struct coll op;
  memset(&op, 0, sizeof op);
  op.kind = K_SPLIT;
  op.comm = c;
  op.dtype = T_INT32;
  op.count = 2;
  void** recv = calloc((size_t)n, sizeof *recv);
  if (!recv) return fail(ncclSystemError, "out of memory");
  pthread_mutex_lock(&c->wire_mu);
  for (int p = 0; p < n; p++)
    if (p != r) {
      plan_send(&P, &op, p, &all[2 * r], 8);
      recv[p] = plan_recv(&P, &op, p, 8, NULL);
    }
  struct ncclComm* bad = NULL;
  int rc = P.oom ? fail(ncclSystemError, "out of memory") : run_plan(&P, &bad);
  pthread_mutex_unlock(&c->wire_mu);
  if (rc == XCHG_OK)
    for (int p = 0; p < n; p++)
      if (p != r) memcpy(&all[2 * p], recv[p], 8);
  plan_free(&P);
  free(recv);
  if (rc == XCHG_ABORTED)
    return fail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
  if (rc != XCHG_OK) set_async_error(c, rc);
  return rc;
}

static uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ull;
  }
  return h;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                  void* config) {
  (void)config;
  settings();
  if (g_version < 21800)
    return fail(ncclInvalidUsage, "ncclCommSplit needs NCCL 2.18 (this is %d)", g_version);
  ncclResult_t rc = check_comm(comm, "ncclCommSplit");
  if (rc) return rc;
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < -1) return fail(ncclInvalidArgument, "ncclCommSplit: invalid color %d", color);
  *newcomm = NULL;
  int n = comm->nranks;
  int32_t* all = calloc((size_t)n * 2, sizeof *all);
  if (!all) return fail(ncclSystemError, "out of memory");
  rc = exchange_split(comm, color, key, all);
  int split = comm->split_count++;
  if (rc != ncclSuccess || color == -1) {
    free(all);
    return rc;
  }
  /* New rank: order by (key, parent rank) among the ranks of this color. */
  int size = 0, newrank = 0;
  for (int p = 0; p < n; p++) {
    if (all[2 * p] != color) continue;
    size++;
    if (all[2 * p + 1] < key || (all[2 * p + 1] == key && p < comm->rank)) newrank++;
  }
  free(all);
  char path[160], token[80];
  snprintf(path, sizeof path, "%s/%d/%d", comm->token, split, color);
  snprintf(token, sizeof token, "%s-%016llx", comm->root_token, (unsigned long long)fnv1a(path));
  return comm_create(newcomm, size, newrank, comm->root_token, token);
}
