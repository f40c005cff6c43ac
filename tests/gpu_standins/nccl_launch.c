/* The stand-in NCCL's launches: a call outside a group, or a whole group, put on a stream as
 * one host function; HVDL_STANDIN_NCCL_FAIL_AFTER picks the launch that fails. */
#include "nccl_internal.h"

#include <stdlib.h>

static _Atomic long g_units = 0;

int launch_add(struct launch* L, const struct coll* op) {
  if (L->nops == L->cap) {
    int cap = L->cap ? L->cap * 2 : 4;
    struct coll* p = realloc(L->ops, (size_t)cap * sizeof *p);
    if (!p) return -1;
    L->ops = p;
    L->cap = cap;
  }
  L->ops[L->nops++] = *op;
  return 0;
}

void launch_free(struct launch* L) {
  if (!L) return;
  free(L->ops);
  free(L->comms);
  free(L);
}

static void launch_finish(struct launch* L) {
  for (int i = 0; i < L->ncomms; i++) {
    struct ncclComm* c = L->comms[i];
    pthread_mutex_lock(&c->mu);
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    comm_unref(c);
  }
  launch_free(L);
}

/* The host function on the stream. */
static void run_launch(void* arg) {
  struct launch* L = arg;
  for (int i = 0; i < L->ncomms; i++)
    if (atomic_load(&L->comms[i]->aborted)) goto done; /* an aborted comm's ops do nothing */
  if (L->fail) {
    for (int i = 0; i < L->ncomms; i++) set_async_error(L->comms[i], ncclSystemError);
    block_until_released(L->comms[0]);
    goto done;
  }
  for (int i = 0; i < L->ncomms; i++) {
    struct ncclComm* c = L->comms[i];
    pthread_mutex_lock(&c->mu);
    int err = c->async_error;
    pthread_mutex_unlock(&c->mu);
    if (err) {
      block_until_released(c);
      goto done;
    }
  }
  struct ncclComm* bad = NULL;
  int rc = execute(L, &bad);
  if (rc > 0) {
    if (!bad) bad = L->comms[0];
    set_async_error(bad, rc);
    block_until_released(bad);
  }
done:
  launch_finish(L);
}

static int comm_cmp(const void* a, const void* b) {
  uint64_t x = (*(struct ncclComm* const*)a)->uid, y = (*(struct ncclComm* const*)b)->uid;
  return x < y ? -1 : x > y;
}

/* Puts L on the stream of its first op (the other streams of a group wait for what was queued
 * on them before, and then for the group). Takes ownership of L. */
ncclResult_t launch_submit(struct launch* L) {
  if (L->nops == 0) {
    launch_free(L);
    return ncclSuccess;
  }
  L->comms = malloc((size_t)L->nops * sizeof *L->comms);
  if (!L->comms) {
    launch_free(L);
    return fail(ncclSystemError, "out of memory");
  }
  for (int i = 0; i < L->nops; i++) {
    int seen = 0;
    for (int j = 0; j < L->ncomms; j++) seen |= L->comms[j] == L->ops[i].comm;
    if (!seen) L->comms[L->ncomms++] = L->ops[i].comm;
  }
  qsort(L->comms, (size_t)L->ncomms, sizeof *L->comms, comm_cmp);
  void* first = L->ops[0].stream;
  void** others = malloc((size_t)L->nops * sizeof *others);
  int nothers = 0;
  if (!others) {
    launch_free(L);
    return fail(ncclSystemError, "out of memory");
  }
  for (int i = 0; i < L->nops; i++) {
    void* s = L->ops[i].stream;
    int seen = s == first;
    for (int j = 0; j < nothers; j++) seen |= others[j] == s;
    if (!seen) others[nothers++] = s;
  }
  settings();
  long unit = atomic_fetch_add(&g_units, 1) + 1;
  if (g_fail_after > 0 && unit == g_fail_after) L->fail = 1;
  for (int i = 0; i < L->ncomms; i++) {
    struct ncclComm* c = L->comms[i];
    pthread_mutex_lock(&c->mu);
    c->refs++;
    c->pending++;
    pthread_mutex_unlock(&c->mu);
  }
  for (int j = 0; j < nothers; j++) {
    void* ev = NULL;
    if (cudaEventCreateWithFlags(&ev, 2) == 0) {
      cudaEventRecord(ev, others[j]);
      cudaStreamWaitEvent(first, ev, 0);
      cudaEventDestroy(ev);
    }
  }
  int crc = cudaLaunchHostFunc(first, run_launch, L);
  if (crc != 0) {
    free(others);
    launch_finish(L);
    return fail(ncclUnhandledCudaError, "cudaLaunchHostFunc failed: CUDA error %d", crc);
  }
  for (int j = 0; j < nothers; j++) {
    void* ev = NULL;
    if (cudaEventCreateWithFlags(&ev, 2) == 0) {
      cudaEventRecord(ev, first);
      cudaStreamWaitEvent(others[j], ev, 0);
      cudaEventDestroy(ev);
    }
  }
  free(others);
  return ncclSuccess;
}
