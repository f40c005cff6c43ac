/* A stand-in for the CUDA runtime (libcudart.so.12) for machines without a GPU.
 *
 * The real runtime's C ABI for the subset the core uses: "device" memory is host memory that
 * cudaMalloc registers in a table, and each stream is an ordered queue of operations run by
 * its own worker thread, so the asynchronous ordering rules (streams, events, cross-stream
 * waits, the legacy default stream) behave as on a GPU. Test hooks at the end ("kernels" that
 * fill or read device memory, a log of what ran in which order).
 *
 * Environment: HVDL_STANDIN_CUDA_DEVICES = number of devices (default 1; 0 = no device).
 * Built by tests/gpu_standins/build.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int cudaError_t;
typedef struct standin_stream* cudaStream_t;
typedef struct standin_event* cudaEvent_t;
typedef void (*cudaHostFn_t)(void*);

enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorNotPermitted = 800,
};

#define STANDIN_VERSION 12080
#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u
#define LOG_LIMIT ((size_t)4 << 20)

/* ------------------------------------------------------------------------------------------ */
/* Errors, devices                                                                             */

static __thread cudaError_t t_last_error = cudaSuccess;
static __thread int t_device = 0;
static __thread int t_in_worker = 0;

static cudaError_t ret(cudaError_t e) {
  /* cudaErrorNotReady is a status, not an error: it does not become the last error. */
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static int g_devices = 1;

static void read_env(void) {
  const char* v = getenv("HVDL_STANDIN_CUDA_DEVICES");
  if (v && *v) {
    char* end = NULL;
    long n = strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= 0 && n <= 64) g_devices = (int)n;
  }
}

static int device_count(void) {
  pthread_once(&g_env_once, read_env);
  return g_devices;
}

/* ------------------------------------------------------------------------------------------ */
/* The log                                                                                     */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char* g_log = NULL;
static size_t g_log_len = 0, g_log_cap = 0;
static int g_log_full = 0;
static _Atomic uint64_t g_seq = 0;

static void log_append(const char* text, size_t n) {
  if (g_log_len + n + 1 > g_log_cap) {
    size_t cap = g_log_cap ? g_log_cap : 4096;
    while (cap < g_log_len + n + 1) cap *= 2;
    char* p = realloc(g_log, cap);
    if (!p) return;
    g_log = p;
    g_log_cap = cap;
  }
  memcpy(g_log + g_log_len, text, n);
  g_log_len += n;
  g_log[g_log_len] = '\0';
}

/* One line "<seq> <text>"; the number is taken under the log's lock, so the text's order is
 * the numbers' order. */
static void logf_line(const char* fmt, ...) {
  char body[320], line[360];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g_log_mu);
  if (!g_log_full) {
    uint64_t seq = atomic_fetch_add(&g_seq, 1) + 1;
    int n = snprintf(line, sizeof line, "%" PRIu64 " %s\n", seq, body);
    if (g_log_len + (size_t)n + 128 > LOG_LIMIT) {
      n = snprintf(line, sizeof line,
                   "%" PRIu64 " log limit reached (%zu bytes): later lines dropped\n", seq,
                   (size_t)LOG_LIMIT);
      g_log_full = 1;
    }
    log_append(line, (size_t)n);
  }
  pthread_mutex_unlock(&g_log_mu);
}

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                      */

enum { MEM_NONE = 0, MEM_DEVICE = 1, MEM_PINNED = 2 };

struct region {
  uintptr_t base;
  size_t size;
  int kind;
};

static pthread_mutex_t g_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct region* g_regions = NULL; /* sorted by base */
static size_t g_nregions = 0, g_regions_cap = 0;

/* Index of the region holding p, or -1. Caller holds g_mem_mu. */
static long region_of(uintptr_t p) {
  size_t lo = 0, hi = g_nregions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_regions[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return -1;
  struct region* r = &g_regions[lo - 1];
  return (p - r->base < r->size) ? (long)(lo - 1) : -1;
}

static int region_add(void* p, size_t size, int kind) {
  pthread_mutex_lock(&g_mem_mu);
  if (g_nregions == g_regions_cap) {
    size_t cap = g_regions_cap ? g_regions_cap * 2 : 64;
    struct region* r = realloc(g_regions, cap * sizeof *r);
    if (!r) {
      pthread_mutex_unlock(&g_mem_mu);
      return -1;
    }
    g_regions = r;
    g_regions_cap = cap;
  }
  size_t i = g_nregions;
  while (i > 0 && g_regions[i - 1].base > (uintptr_t)p) {
    g_regions[i] = g_regions[i - 1];
    i--;
  }
  g_regions[i].base = (uintptr_t)p;
  g_regions[i].size = size;
  g_regions[i].kind = kind;
  g_nregions++;
  pthread_mutex_unlock(&g_mem_mu);
  return 0;
}

/* Removes the region starting exactly at p with the given kind; 0 on success. */
static int region_remove(void* p, int kind) {
  pthread_mutex_lock(&g_mem_mu);
  long i = region_of((uintptr_t)p);
  if (i < 0 || g_regions[i].base != (uintptr_t)p || g_regions[i].kind != kind) {
    pthread_mutex_unlock(&g_mem_mu);
    return -1;
  }
  memmove(&g_regions[i], &g_regions[i + 1], (g_nregions - (size_t)i - 1) * sizeof *g_regions);
  g_nregions--;
  pthread_mutex_unlock(&g_mem_mu);
  return 0;
}

/* What [p, p+n) is: MEM_DEVICE / MEM_PINNED when p lies in such an allocation (the whole range
 * must then fit in it, else -1), MEM_NONE for other host memory. */
static int mem_kind(const void* p, size_t n) {
  pthread_mutex_lock(&g_mem_mu);
  long i = region_of((uintptr_t)p);
  int kind = MEM_NONE;
  if (i >= 0) {
    struct region* r = &g_regions[i];
    kind = ((uintptr_t)p - r->base + n <= r->size) ? r->kind : -1;
  }
  pthread_mutex_unlock(&g_mem_mu);
  return kind;
}

/* ------------------------------------------------------------------------------------------ */
/* Streams and events                                                                          */

/* One record of an event: done when its stream's worker reaches it. Shared by the event (its
 * latest record) and by the operations that refer to it; freed with the last reference. */
struct record {
  int done;
  int refs;
};

struct standin_event {
  uint32_t magic;
  int id;
  int destroyed;
  struct record* latest;
};

enum { OP_MEMCPY, OP_RECORD, OP_WAIT, OP_FILL, OP_READ, OP_HOSTFN, OP_MEMSET };

struct dep {
  struct standin_stream* stream;
  uint64_t ticket;
};

struct op {
  int type;
  uint64_t ticket;
  struct dep* deps; /* implicit ordering against the legacy default stream */
  int ndeps;
  void* dst;
  const void* src;
  size_t n;
  int kind;
  int delay_ms;
  int value;
  void* owned;
  struct record* rec;
  int eid;
  cudaHostFn_t fn;
  void* user;
  struct op* next;
};

struct standin_stream {
  uint32_t magic;
  int id;
  unsigned flags;
  int destroyed;
  struct op *head, *tail;
  uint64_t enqueued, completed;
  pthread_cond_t work;
  int thread_started;
};

/* One lock for all stream and event state; g_done is broadcast whenever an operation
 * completes. Operations themselves (copies, host functions) run without it. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;

static struct standin_stream g_default = {STREAM_MAGIC, 0, 0, 0, NULL, NULL, 0, 0,
                                          PTHREAD_COND_INITIALIZER, 0};
/* Every stream and event ever created (never freed, so a stale handle is recognised). */
static struct standin_stream** g_streams = NULL;
static size_t g_nstreams = 0, g_streams_cap = 0;
static struct standin_event** g_events = NULL;
static size_t g_nevents = 0, g_events_cap = 0;
static int g_next_stream_id = 1, g_next_event_id = 1;

static int grow(void** array, size_t* cap, size_t n, size_t elem) {
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
static struct standin_stream* stream_of(cudaStream_t s) {
  uintptr_t v = (uintptr_t)s;
  if (v == 0 || v == 1 || v == 2) return &g_default;
  for (size_t i = 0; i < g_nstreams; i++)
    if (g_streams[i] == s) return g_streams[i]->destroyed ? NULL : g_streams[i];
  return NULL;
}

static struct standin_event* event_of(cudaEvent_t e) {
  for (size_t i = 0; e && i < g_nevents; i++)
    if (g_events[i] == e) return g_events[i]->destroyed ? NULL : g_events[i];
  return NULL;
}

static void record_release(struct record* r) {
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
static cudaError_t enqueue(struct standin_stream* s, struct op* op) {
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

static struct op* new_op(int type) {
  struct op* op = calloc(1, sizeof *op);
  if (op) op->type = type;
  return op;
}

/* Waits until every stream has completed what was queued on it at the time of the call.
 * Caller holds g_mu. */
static void device_sync_locked(void) {
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
  pthread_mutex_init(&g_log_mu, NULL);
  pthread_mutex_init(&g_mem_mu, NULL);
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

/* ------------------------------------------------------------------------------------------ */
/* The runtime API                                                                             */

EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return ret(cudaErrorInvalidValue);
  int n = device_count();
  *count = n;
  return ret(n == 0 ? cudaErrorNoDevice : cudaSuccess);
}

EXPORT cudaError_t cudaSetDevice(int device) {
  int n = device_count();
  if (n == 0) return ret(cudaErrorNoDevice);
  if (device < 0 || device >= n) return ret(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int* device) {
  if (!device) return ret(cudaErrorInvalidValue);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  int n = device_count();
  if (n == 0) return ret(cudaErrorNoDevice);
  if (device < 0 || device >= n) return ret(cudaErrorInvalidDevice);
  char text[32];
  int k = snprintf(text, sizeof text, "0000:%02x:00.0", device + 1);
  if (!id || len <= k) return ret(cudaErrorInvalidValue);
  memcpy(id, text, (size_t)k + 1);
  return cudaSuccess;
}

EXPORT cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return ret(cudaErrorInvalidValue);
  *version = STANDIN_VERSION;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return ret(cudaErrorInvalidValue);
  *version = STANDIN_VERSION;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

EXPORT const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotPermitted: return "operation not permitted";
    default: return "unrecognized error code";
  }
}

EXPORT const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    default: return "unrecognized error code";
  }
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

EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return ret(cudaErrorInvalidValue);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  size_t rounded = (size + 255) & ~(size_t)255;
  if (rounded < size) return ret(cudaErrorMemoryAllocation);
  void* p = aligned_alloc(256, rounded);
  if (!p) return ret(cudaErrorMemoryAllocation);
  if (region_add(p, size, MEM_DEVICE) != 0) {
    free(p);
    return ret(cudaErrorMemoryAllocation);
  }
  *ptr = p;
  return cudaSuccess;
}

/* Waits for the device (as the real cudaFree does) so queued work never touches freed memory. */
EXPORT cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (t_in_worker) return ret(cudaErrorNotPermitted);
  if (mem_kind(ptr, 0) != MEM_DEVICE) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&g_mu);
  device_sync_locked();
  pthread_mutex_unlock(&g_mu);
  if (region_remove(ptr, MEM_DEVICE) != 0) return ret(cudaErrorInvalidValue);
  free(ptr);
  return cudaSuccess;
}

EXPORT cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned flags) {
  (void)flags;
  if (!ptr) return ret(cudaErrorInvalidValue);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  size_t rounded = (size + 4095) & ~(size_t)4095;
  if (rounded < size) return ret(cudaErrorMemoryAllocation);
  void* p = aligned_alloc(4096, rounded);
  if (!p) return ret(cudaErrorMemoryAllocation);
  if (region_add(p, size, MEM_PINNED) != 0) {
    free(p);
    return ret(cudaErrorMemoryAllocation);
  }
  *ptr = p;
  return cudaSuccess;
}

EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

EXPORT cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (t_in_worker) return ret(cudaErrorNotPermitted);
  if (mem_kind(ptr, 0) != MEM_PINNED) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&g_mu);
  device_sync_locked();
  pthread_mutex_unlock(&g_mu);
  if (region_remove(ptr, MEM_PINNED) != 0) return ret(cudaErrorInvalidValue);
  free(ptr);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind,
                                   cudaStream_t stream) {
  if (kind < 0 || kind > 4) return ret(cudaErrorInvalidMemcpyDirection);
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (n > 0) {
    if (!dst || !src) return ret(cudaErrorInvalidValue);
    int dk = mem_kind(dst, n), sk = mem_kind(src, n);
    if (dk < 0 || sk < 0) return ret(cudaErrorInvalidValue);
    int ddev = dk == MEM_DEVICE, sdev = sk == MEM_DEVICE;
    int ok = kind == 4 || (kind == 0 && !ddev && !sdev) || (kind == 1 && ddev && !sdev) ||
             (kind == 2 && !ddev && sdev) || (kind == 3 && ddev && sdev);
    if (!ok) return ret(cudaErrorInvalidValue);
  }
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  if (!s) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorInvalidResourceHandle);
  }
  struct op* op = new_op(OP_MEMCPY);
  if (!op) {
    pthread_mutex_unlock(&g_mu);
    return ret(cudaErrorMemoryAllocation);
  }
  op->dst = dst;
  op->src = src;
  op->n = n;
  op->kind = kind;
  cudaError_t rc = enqueue(s, op);
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

/* Ordered on the legacy default stream, and returns when the copy is done. */
EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, int kind) {
  if (t_in_worker) return ret(cudaErrorNotPermitted);
  cudaError_t rc = cudaMemcpyAsync(dst, src, n, kind, NULL);
  if (rc != cudaSuccess) return rc;
  pthread_mutex_lock(&g_mu);
  uint64_t ticket = g_default.enqueued;
  while (g_default.completed < ticket) pthread_cond_wait(&g_done, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream) {
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (n > 0 && mem_kind(dst, n) != MEM_DEVICE) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  struct op* op = s ? new_op(OP_MEMSET) : NULL;
  if (!op) {
    pthread_mutex_unlock(&g_mu);
    return ret(s ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle);
  }
  op->dst = dst;
  op->n = n;
  op->value = value;
  cudaError_t rc = enqueue(s, op);
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
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

/* ------------------------------------------------------------------------------------------ */
/* Test hooks                                                                                  */

static int kernel_accessible(const void* p, size_t n) {
  int kind = mem_kind(p, n);
  return kind == MEM_DEVICE || kind == MEM_PINNED;
}

/* A "kernel" writing device memory (or pinned host memory, which kernels can reach too): src
 * is copied now; when the stream reaches it, it sleeps delay_ms and then writes those bytes to
 * dst. */
EXPORT int standin_cuda_launch_fill(cudaStream_t stream, void* dst, const void* src, size_t n,
                                    int delay_ms) {
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (n > 0 && (!src || !kernel_accessible(dst, n))) return ret(cudaErrorInvalidValue);
  void* copy = NULL;
  if (n > 0) {
    copy = malloc(n);
    if (!copy) return ret(cudaErrorMemoryAllocation);
    memcpy(copy, src, n);
  }
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  struct op* op = s ? new_op(OP_FILL) : NULL;
  if (!op) {
    pthread_mutex_unlock(&g_mu);
    free(copy);
    return ret(s ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle);
  }
  op->dst = dst;
  op->n = n;
  op->owned = copy;
  op->delay_ms = delay_ms;
  cudaError_t rc = enqueue(s, op);
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

/* A "kernel" reading device (or pinned) memory into host memory when the stream reaches it. */
EXPORT int standin_cuda_launch_read(cudaStream_t stream, void* host_dst, const void* src,
                                    size_t n) {
  if (device_count() == 0) return ret(cudaErrorNoDevice);
  if (n > 0 && (!host_dst || !kernel_accessible(src, n))) return ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  struct op* op = s ? new_op(OP_READ) : NULL;
  if (!op) {
    pthread_mutex_unlock(&g_mu);
    return ret(s ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle);
  }
  op->dst = host_dst;
  op->src = src;
  op->n = n;
  cudaError_t rc = enqueue(s, op);
  pthread_mutex_unlock(&g_mu);
  return ret(rc);
}

EXPORT size_t standin_cuda_log(char* buf, size_t cap) {
  pthread_mutex_lock(&g_log_mu);
  size_t len = g_log_len;
  if (buf && cap > 0) {
    size_t n = len < cap ? len : cap;
    if (n) memcpy(buf, g_log, n);
    if (n < cap) buf[n] = '\0';
  }
  pthread_mutex_unlock(&g_log_mu);
  return len;
}

EXPORT void standin_cuda_log_clear(void) {
  pthread_mutex_lock(&g_log_mu);
  g_log_len = 0;
  if (g_log) g_log[0] = '\0';
  g_log_full = 0;
  pthread_mutex_unlock(&g_log_mu);
}

EXPORT int standin_cuda_stream_id(cudaStream_t stream) {
  pthread_mutex_lock(&g_mu);
  struct standin_stream* s = stream_of(stream);
  int id = s ? s->id : -1;
  pthread_mutex_unlock(&g_mu);
  return id;
}

EXPORT int standin_cuda_event_id(cudaEvent_t event) {
  pthread_mutex_lock(&g_mu);
  struct standin_event* e = event_of(event);
  int id = e ? e->id : -1;
  pthread_mutex_unlock(&g_mu);
  return id;
}

/* For the stand-in NCCL: 1 when [p, p+n) lies in one cudaMalloc allocation, 2 in one
 * cudaHostAlloc allocation, 0 for other host memory, -1 when it starts in an allocation and
 * runs past its end. */
EXPORT int standin_cuda_ptr_kind(const void* p, size_t n) { return mem_kind(p, n); }
