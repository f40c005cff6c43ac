/* The stand-in CUDA runtime's streams: each an ordered queue of operations run by its own
 * worker thread, which takes the global lock only between operations. The legacy default
 * stream orders itself against the blocking streams as on a GPU. */
#include "cudart_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__thread int t_in_worker = 0;

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;

struct standin_stream g_default = {STREAM_MAGIC, 0, 0, 0, NULL, NULL, 0, 0,
                                   PTHREAD_COND_INITIALIZER, 0};
/* Every stream ever created (never freed, so a stale handle is recognised). */
static struct standin_stream** g_streams = NULL;
static size_t g_nstreams = 0, g_streams_cap = 0;
static int g_next_stream_id = 1;

int grow(void** array, size_t* cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t c = *cap ? *cap * 2 : 16;
  void* p = realloc(*array, c * elem);
  if (!p) return -1;
  *array = p;
  *cap = c;
  return 0;
}

/* The stream a handle names (NULL, cudaStreamLegacy and cudaStreamPerThread all mean the
 * default stream), or NULL for an unknown or destroyed one. Caller holds g_mu. */
struct standin_stream* stream_of(cudaStream_t s) {
  uintptr_t v = (uintptr_t)s;
  if (v == 0 || v == 1 || v == 2) return &g_default;
  for (size_t i = 0; i < g_nstreams; i++)
    if (g_streams[i] == s) return g_streams[i]->destroyed ? NULL : g_streams[i];
  return NULL;
}

void record_release(struct record* r) {
  if (r && --r->refs == 0) free(r);
}

static int deps_done(const struct op* op) {
  for (int i = 0; i < op->ndeps; i++)
    if (op->deps[i].stream->completed < op->deps[i].ticket) return 0;
  return 1;
}

static void run_op(struct standin_stream* s, struct op* op) {
  switch (op->type) {
    case OP_MEMCPY:
      if (op->n) memmove(op->dst, op->src, op->n);
      logf_line("run stream=%d memcpy kind=%d dst=0x%" PRIxPTR " src=0x%" PRIxPTR " n=%zu", s->id,
                op->kind, (uintptr_t)op->dst, (uintptr_t)op->src, op->n);
      break;
    case OP_MEMSET:
      if (op->n) memset(op->dst, op->value, op->n);
      logf_line("run stream=%d memset dst=0x%" PRIxPTR " n=%zu", s->id, (uintptr_t)op->dst, op->n);
      break;
    case OP_FILL:
      if (op->delay_ms > 0) {
        struct timespec ts = {op->delay_ms / 1000, (long)(op->delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
      }
      if (op->n) memcpy(op->dst, op->owned, op->n);
      logf_line("run stream=%d fill dst=0x%" PRIxPTR " n=%zu", s->id, (uintptr_t)op->dst, op->n);
      break;
    case OP_READ:
      if (op->n) memcpy(op->dst, op->src, op->n);
      logf_line("run stream=%d read src=0x%" PRIxPTR " n=%zu", s->id, (uintptr_t)op->src, op->n);
      break;
    case OP_HOSTFN:
      op->fn(op->user);
      logf_line("run stream=%d host_func", s->id);
      break;
    case OP_RECORD:
      logf_line("run stream=%d record event=%d", s->id, op->eid);
      break;
    case OP_WAIT:
      logf_line("run stream=%d wait event=%d done", s->id, op->eid);
      break;
  }
}

static void* worker_main(void* arg) {
  struct standin_stream* s = arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the application's threads */
  t_in_worker = 1;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!s->head && !s->destroyed) pthread_cond_wait(&s->work, &g_mu);
    if (!s->head) break; /* destroyed and drained */
    struct op* op = s->head;
    while (!deps_done(op)) pthread_cond_wait(&g_done, &g_mu);
    if (op->type == OP_WAIT)
      while (!op->rec->done) pthread_cond_wait(&g_done, &g_mu);
    pthread_mutex_unlock(&g_mu);
    run_op(s, op);
    pthread_mutex_lock(&g_mu);
    if (op->type == OP_RECORD) op->rec->done = 1;
    record_release(op->rec);
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->completed = op->ticket;
    pthread_cond_broadcast(&g_done);
    free(op->deps);
    free(op->owned);
    free(op);
  }
  s->thread_started = 0;
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

static void add_dep(struct op* op, struct standin_stream* t) {
  struct dep* d = realloc(op->deps, (size_t)(op->ndeps + 1) * sizeof *d);
  if (!d) return;
  op->deps = d;
  d[op->ndeps].stream = t;
  d[op->ndeps].ticket = t->enqueued;
  op->ndeps++;
}

/* Appends op to s. The legacy default stream orders itself against the blocking streams (those
 * created without cudaStreamNonBlocking): an op on it waits for the work already queued on
 * them, and an op on a blocking stream waits for the work already queued on it. Caller holds
 * g_mu; on failure op is freed. */
cudaError_t enqueue(struct standin_stream* s, struct op* op) {
  if (s == &g_default) {
    for (size_t i = 0; i < g_nstreams; i++) {
      struct standin_stream* t = g_streams[i];
      if (!(t->flags & 1u) && t->enqueued > t->completed) add_dep(op, t);
    }
  } else if (!(s->flags & 1u) && g_default.enqueued > g_default.completed) {
    add_dep(op, &g_default);
  }
  if (!s->thread_started) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, worker_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      record_release(op->rec);
      free(op->deps);
      free(op->owned);
      free(op);
      return cudaErrorMemoryAllocation;
    }
    s->thread_started = 1;
  }
  op->ticket = ++s->enqueued;
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_signal(&s->work);
  return cudaSuccess;
}

struct op* new_op(int type) {
  struct op* op = calloc(1, sizeof *op);
  if (op) op->type = type;
  return op;
}

/* Waits until every stream has completed what was queued on it at the time of the call.
 * Caller holds g_mu. */
void device_sync_locked(void) {
  size_t n = g_nstreams;
  uint64_t* tickets = malloc((n + 1) * sizeof *tickets);
  if (!tickets) return;
  tickets[n] = g_default.enqueued;
  for (size_t i = 0; i < n; i++) tickets[i] = g_streams[i]->enqueued;
  for (;;) {
    int done = g_default.completed >= tickets[n];
    for (size_t i = 0; done && i < n; i++) done = g_streams[i]->completed >= tickets[i];
    if (done) break;
    pthread_cond_wait(&g_done, &g_mu);
  }
  free(tickets);
}

/* fork(): the child has no workers; let it start new ones (its queues are the parent's). */
static void atfork_child(void) {
  pthread_mutex_init(&g_mu, NULL);
  log_reset_after_fork();
  memory_reset_after_fork();
  pthread_cond_init(&g_done, NULL);
  g_default.thread_started = 0;
  pthread_cond_init(&g_default.work, NULL);
  for (size_t i = 0; i < g_nstreams; i++) {
    g_streams[i]->thread_started = 0;
    pthread_cond_init(&g_streams[i]->work, NULL);
  }
}

__attribute__((constructor)) static void standin_init(void) {
  pthread_atfork(NULL, NULL, atfork_child);
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (!stream) return ret(cudaErrorInvalidValue);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (flags & ~1u) return ret(cudaErrorInvalidValue);
  struct standin_stream* s = calloc(1, sizeof *s);
  if (!s) return ret(cudaErrorMemoryAllocation);
  s->magic = STREAM_MAGIC;
  s->flags = flags;
  pthread_cond_init(&s->work, NULL);
  pthread_mutex_lock(&g_mu);
  if (grow((void**)&g_streams, &g_streams_cap, g_nstreams, sizeof *g_streams) != 0) {
    pthread_mutex_unlock(&g_mu);
    free(s);
    return ret(cudaErrorMemoryAllocation);
  }
  s->id = g_next_stream_id++;
  g_streams[g_nstreams++] = s;
  pthread_mutex_unlock(&g_mu);
  *stream = s;
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, 0);
}

/* Returns at once; the stream's queued work still runs, then its worker ends. */
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  if (!s || s == &g_default) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  s->destroyed = 1;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (t_in_worker) return ret(cudaErrorNotPermitted);
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  if (!s) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  logf_line("call stream_synchronize stream=%d", s->id);
  uint64_t ticket = s->enqueued;
  while (s->completed < ticket) pthread_cond_wait(&g_done, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) {
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  cudaError_t e = !s ? cudaErrorInvalidResourceHandle
                     : (s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady);
  pthread_mutex_unlock(&g_mu);
  return ret(e);
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
  if (t_in_worker) return ret(cudaErrorNotPermitted);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  pthread_mutex_lock(&g_mu);
  device_sync_locked();
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user) {
  if (!fn) return ret(cudaErrorInvalidValue);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  struct op* op = s ? new_op(OP_HOSTFN) : NULL;
  if (!op) {
    pthread_mutex_unlock(&g_mu);
    return ret(s ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle);
  }
  op->fn = fn;
  op->user = user;
  cudaError_t rc = enqueue(s, op);
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

EXPORT int standin_cuda_stream_id(cudaStream_t stream) {
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  int id = s ? s->id : -1;
  pthread_mutex_unlock(&g_mu);
  return id;
}
