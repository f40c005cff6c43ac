/* The stand-in NCCL running a launch on the stream's worker: every op's messages planned and
 * moved at once, then each op's output written, reductions in rank order. */
#include "nccl_wire.h"

#include <stdlib.h>
#include <string.h>

/* A message a rank sends itself: a snapshot, matched in order with its receives from itself. */
struct self_msg {
  const void* data;
  uint64_t bytes;
};

/* Plans one op's messages; returns the per-peer receive buffers through recv[] (NULL for the
 * own rank). */
static void plan_op(struct plan* P, const struct coll* op, void** recv, unsigned char* scal,
                    struct self_msg** self_q, int* self_n, int* self_cap) {
  struct ncclComm* c = op->comm;
  int n = c->nranks, r = c->rank;
  size_t es = g_type_size[op->dtype];
  uint64_t nb = (uint64_t)op->count * es;
  for (int p = 0; p < n; p++) recv[p] = NULL;
  switch (op->kind) {
    case K_ALLREDUCE:
    case K_ALLGATHER:
      for (int p = 0; p < n; p++)
        if (p != r) {
          plan_send(P, op, p, op->sendbuff, nb);
          recv[p] = plan_recv(P, op, p, nb, scal + 8 * p);
        }
      break;
    case K_REDUCESCATTER:
      for (int p = 0; p < n; p++)
        if (p != r) {
          plan_send(P, op, p, (const char*)op->sendbuff + (size_t)p * nb, nb);
          recv[p] = plan_recv(P, op, p, nb, scal + 8 * p);
        }
      break;
    case K_BROADCAST:
      if (r == op->peer) {
        for (int p = 0; p < n; p++)
          if (p != r) plan_send(P, op, p, op->sendbuff, nb);
      } else {
        recv[op->peer] = plan_recv(P, op, op->peer, nb, NULL);
      }
      break;
    case K_REDUCE:
      if (r == op->peer) {
        for (int p = 0; p < n; p++)
          if (p != r) recv[p] = plan_recv(P, op, p, nb, scal + 8 * p);
      } else {
        plan_send(P, op, op->peer, op->sendbuff, nb);
      }
      break;
    case K_SEND:
      if (op->peer != r) {
        plan_send(P, op, op->peer, op->sendbuff, nb);
      } else {
        /* To self: a snapshot now, matched in order with the receives from self. */
        void* copy = plan_tmp(P, nb);
        if (copy && nb) memcpy(copy, op->sendbuff, nb);
        if (*self_n == *self_cap) {
          int cap = *self_cap ? *self_cap * 2 : 4;
          struct self_msg* q = realloc(*self_q, (size_t)cap * sizeof *q);
          if (!q) {
            P->oom = 1;
            return;
          }
          *self_q = q;
          *self_cap = cap;
        }
        (*self_q)[*self_n].data = copy;
        (*self_q)[(*self_n)++].bytes = nb;
      }
      break;
    case K_RECV:
      if (op->peer != r) recv[op->peer] = plan_recv(P, op, op->peer, nb, NULL);
      break;
  }
}

/* The elements NCCL writes of a one-rank reduction. Before 2.29.7 (NVIDIA/nccl#1950) a
 * one-rank PreMulSum (which ncclAvg on floating-point types is) runs on min(32, bytes / 16 KiB
 * rounded up) blocks of count / blocks elements rounded down, then up to whole 16-byte packs:
 * the elements past blocks x that are never written. The stand-in leaves them as they were,
 * as the real library does, so that the core's way around it is tested. */
static size_t one_rank_written(const struct coll* op) {
  size_t es = g_type_size[op->dtype], nb = op->count * es;
  if (op->comm->nranks != 1 || op->red != R_PREMUL || g_version >= 22907 || nb == 0)
    return op->count;
  size_t blocks = (nb + (16u << 10) - 1) / (16u << 10);
  if (blocks > 32) blocks = 32;
  size_t per_pack = 16 / es, per_block = op->count / blocks;
  per_block = (per_block + per_pack - 1) / per_pack * per_pack;
  return blocks * per_block < op->count ? blocks * per_block : op->count;
}

/* Reduces the ranks' contributions in rank order into out; scal[q]: rank q's factor. */
static int reduce_ranks(struct coll* op, void** recv, const unsigned char* scal, const char* own,
                        void* out) {
  struct ncclComm* c = op->comm;
  size_t nb = op->count * g_type_size[op->dtype];
  void* acc = malloc(nb ? nb : 1);
  if (!acc) return -1;
  for (int q = 0; q < c->nranks; q++) {
    const void* src = q == c->rank ? own : recv[q];
    const unsigned char* factor = q == c->rank ? op->scalar : scal + 8 * q;
    accumulate(acc, src, op->count, op->dtype, op->red == R_SUMDIV ? R_SUM : op->red, factor,
               q == 0);
  }
  if (op->red == R_SUMDIV) divide(acc, op->count, op->dtype, c->nranks);
  if (nb) memcpy(out, acc, one_rank_written(op) * g_type_size[op->dtype]);
  free(acc);
  return 0;
}

/* Writes one op's output from what arrived (recv[q]; scal + 8 * q: rank q's factor); the
 * receives from itself take the messages it sent itself, in order. Returns XCHG_OK,
 * ncclSystemError (out of memory), or an error with *bad = the comm. */
static int write_output(struct coll* op, void** recv, const unsigned char* scal,
                        const struct self_msg* self_q, int self_n, int* self_used,
                        struct ncclComm** bad) {
  struct ncclComm* c = op->comm;
  size_t es = g_type_size[op->dtype], nb = op->count * es;
  int rc = XCHG_OK;
  switch (op->kind) {
    case K_ALLREDUCE:
      if (reduce_ranks(op, recv, scal, op->sendbuff, op->recvbuff) != 0) rc = ncclSystemError;
      break;
    case K_REDUCE:
      if (c->rank == op->peer && reduce_ranks(op, recv, scal, op->sendbuff, op->recvbuff) != 0)
        rc = ncclSystemError;
      break;
    case K_REDUCESCATTER:
      if (reduce_ranks(op, recv, scal, (const char*)op->sendbuff + (size_t)c->rank * nb,
                       op->recvbuff) != 0)
        rc = ncclSystemError;
      break;
    case K_BROADCAST:
      if (!nb) break;
      if (c->rank == op->peer) {
        if (op->recvbuff != op->sendbuff) memmove(op->recvbuff, op->sendbuff, nb);
      } else {
        memcpy(op->recvbuff, recv[op->peer], nb);
      }
      break;
    case K_ALLGATHER:
      if (!nb) break;
      memmove((char*)op->recvbuff + (size_t)c->rank * nb, op->sendbuff, nb);
      for (int q = 0; q < c->nranks; q++)
        if (q != c->rank) memcpy((char*)op->recvbuff + (size_t)q * nb, recv[q], nb);
      break;
    case K_RECV:
      if (op->peer != c->rank) {
        if (nb) memcpy(op->recvbuff, recv[op->peer], nb);
      } else if (*self_used < self_n && self_q[*self_used].bytes == nb) {
        if (nb) memcpy(op->recvbuff, self_q[*self_used].data, nb);
        (*self_used)++;
      } else {
        rc = fail(ncclInvalidUsage,
                  "rank %d: ncclRecv of %zu bytes from itself without a matching ncclSend",
                  c->rank, nb);
        *bad = c;
      }
      break;
    default:
      break;
  }
  return rc;
}

/* Communicates, then writes every op's output, in op order. */
int execute(struct launch* L, struct ncclComm** bad) {
  struct plan P;
  memset(&P, 0, sizeof P);
  int maxn = 1;
  for (int i = 0; i < L->ncomms; i++)
    if (L->comms[i]->nranks > maxn) maxn = L->comms[i]->nranks;
  void** recvs = calloc((size_t)L->nops * (size_t)maxn, sizeof *recvs);
  unsigned char* scals = calloc((size_t)L->nops * (size_t)maxn, 8);
  struct self_msg* self_q = NULL;
  int self_n = 0, self_cap = 0, self_used = 0;
  int rc = XCHG_OK;
  *bad = NULL;
  if (!recvs || !scals) {
    free(recvs);
    free(scals);
    *bad = L->comms[0];
    return fail(ncclSystemError, "out of memory");
  }
  for (int i = 0; i < L->ncomms; i++) pthread_mutex_lock(&L->comms[i]->wire_mu);
  for (int i = 0; i < L->ncomms; i++)
    if (atomic_load(&L->comms[i]->aborted)) rc = XCHG_ABORTED;
  if (rc == XCHG_OK) {
    for (int i = 0; i < L->nops; i++) {
      struct coll* op = &L->ops[i];
      if (op->red == R_PREMUL && op->scalar_ptr) /* a device scalar: read when the op runs */
        memcpy(op->scalar, op->scalar_ptr, g_type_size[op->dtype]);
      plan_op(&P, op, recvs + (size_t)i * (size_t)maxn, scals + (size_t)i * (size_t)maxn * 8,
              &self_q, &self_n, &self_cap);
    }
    if (P.oom) {
      rc = fail(ncclSystemError, "out of memory");
      *bad = L->comms[0];
    } else {
      rc = run_plan(&P, bad);
    }
  }
  for (int i = L->ncomms - 1; i >= 0; i--) pthread_mutex_unlock(&L->comms[i]->wire_mu);
  for (int i = 0; rc == XCHG_OK && i < L->nops; i++) {
    struct coll* op = &L->ops[i];
    rc = write_output(op, recvs + (size_t)i * (size_t)maxn, scals + (size_t)i * (size_t)maxn * 8,
                      self_q, self_n, &self_used, bad);
    if (rc == ncclSystemError && !*bad) {
      fail(ncclSystemError, "out of memory");
      *bad = op->comm;
    }
  }
  plan_free(&P);
  free(recvs);
  free(scals);
  free(self_q);
  return rc;
}
