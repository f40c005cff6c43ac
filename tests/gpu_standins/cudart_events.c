/* The stand-in CUDA runtime's events: a record is an operation on a stream, done when the
 * stream's worker reaches it; a stream waits for an event's latest record as of the call. */
#include "cudart_internal.h"

#include <stdlib.h>

/* Every event ever created (never freed, so a stale handle is recognised). */
static struct standin_event** g_events = NULL;
static size_t g_nevents = 0, g_events_cap = 0;
static int g_next_event_id = 1;

struct standin_event* event_of(cudaEvent_t e) {
  for (size_t i = 0; e && i < g_nevents; i++)
    if (g_events[i] == e) return g_events[i]->destroyed ? NULL : g_events[i];
  return NULL;
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (!event) return ret(cudaErrorInvalidValue);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (flags & ~0x7u) return ret(cudaErrorInvalidValue);
  struct standin_event* e = calloc(1, sizeof *e);
  if (!e) return ret(cudaErrorMemoryAllocation);
  e->magic = EVENT_MAGIC;
  pthread_mutex_lock(&g_mu);
  if (grow((void**)&g_events, &g_events_cap, g_nevents, sizeof *g_events) != 0) {
    pthread_mutex_unlock(&g_mu);
    free(e);
    return ret(cudaErrorMemoryAllocation);
  }
  e->id = g_next_event_id++;
  g_events[g_nevents++] = e;
  pthread_mutex_unlock(&g_mu);
  *event = e;
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, 0);
}

/* Like the real runtime, a pending record still completes after the event is destroyed. */
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  if (!e) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  e->destroyed = 1;
  record_release(e->latest);
  e->latest = NULL;
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  struct standin_stream* s = stream_of(stream);
  if (!e || !s) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  struct op* op = new_op(OP_RECORD);
  struct record* r = calloc(1, sizeof *r);
  if (!op || !r) {
    pthread_mutex_unlock(&g_mu);
    free(op);
    free(r);
    return ret(cudaErrorMemoryAllocation);
  }
  logf_line("call event_record stream=%d event=%d", s->id, e->id);
  r->refs = 2; /* the event's latest record, and the op */
  op->rec = r;
  op->eid = e->id;
  cudaError_t rc = enqueue(s, op);
  if (rc == cudaSuccess) {
    record_release(e->latest);
    e->latest = r;
  } else {
    record_release(r);
  }
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

/* The stream waits for the event's latest record as of this call (none: no wait). */
EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  (void)flags;
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  struct standin_stream* s = stream_of(stream);
  if (!e || !s) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  logf_line("call stream_wait stream=%d event=%d", s->id, e->id);
  cudaError_t rc = cudaSuccess;
  if (e->latest) {
    struct op* op = new_op(OP_WAIT);
    if (!op) {
      pthread_mutex_unlock(&g_mu);
      return ret(cudaErrorMemoryAllocation);
    }
    op->rec = e->latest;
    op->rec->refs++;
    op->eid = e->id;
    rc = enqueue(s, op);
  }
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  cudaError_t rc = !e ? cudaErrorInvalidResourceHandle
                      : (!e->latest || e->latest->done ? cudaSuccess : cudaErrorNotReady);
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (t_in_worker) return ret(cudaErrorNotPermitted);
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  if (!e) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  logf_line("call event_synchronize event=%d", e->id);
  struct record* r = e->latest;
  if (r) {
    r->refs++;
    while (!r->done) pthread_cond_wait(&g_done, &g_mu);
    record_release(r);
  }
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

EXPORT int standin_cuda_event_id(cudaEvent_t event) {
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  int id = e ? e->id : -1;
  pthread_mutex_unlock(&g_mu);
  return id;
}
