/* The stand-in CUDA runtime's private declarations, shared by its sources (cudart_*.c).
 *
 * A stand-in for the CUDA runtime (libcudart.so.12) for machines without a GPU: the real
 * runtime's C ABI for the subset the core uses. "Device" memory is host memory that cudaMalloc
 * registers in a table (cudart_memory.c), and each stream is an ordered queue of operations run
 * by its own worker thread (cudart_streams.c, cudart_events.c), so the asynchronous ordering
 * rules (streams, events, cross-stream waits, the legacy default stream) behave as on a GPU.
 * Test hooks: "kernels" that fill or read device memory (cudart_kernels.c), a log of what ran
 * in which order (cudart_log.c). Device queries and errors: cudart_device.c.
 *
 * Environment: HVDL_STANDIN_CUDA_DEVICES = number of devices (default 1; 0 = no device).
 * Built by tests/gpu_standins/build.py, with -fvisibility=hidden: only EXPORT functions are
 * the library's symbols. */
#ifndef HVDL_STANDIN_CUDART_INTERNAL_H
#define HVDL_STANDIN_CUDART_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u

#pragma GCC visibility push(hidden)

/* Errors, devices (cudart_device.c) */

/* Returns e, making it the thread's last error unless it is a status. */
cudaError_t ret(cudaError_t e);
int device_count(void);

/* The log (cudart_log.c) */

/* Appends one line "<seq> <text>" to the log. */
void logf_line(const char* fmt, ...);
void log_reset_after_fork(void);

/* Memory (cudart_memory.c) */

enum { MEM_NONE = 0, MEM_DEVICE = 1, MEM_PINNED = 2 };

int mem_kind(const void* p, size_t n);
void memory_reset_after_fork(void);

/* Streams and events (cudart_streams.c, cudart_events.c) */

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
extern pthread_mutex_t g_mu;
extern pthread_cond_t g_done;
extern struct standin_stream g_default;
/* 1 on a stream's worker thread, where the synchronizing calls are not permitted. */
extern __thread int t_in_worker;

int grow(void** array, size_t* cap, size_t n, size_t elem);
/* The stream or event a handle names, or NULL for an unknown or destroyed one. Caller holds
 * g_mu. */
struct standin_stream* stream_of(cudaStream_t s);
struct standin_event* event_of(cudaEvent_t e);
void record_release(struct record* r);
struct op* new_op(int type);
/* Appends op to s; caller holds g_mu; on failure op is freed. */
cudaError_t enqueue(struct standin_stream* s, struct op* op);
/* Waits until every stream has completed what was queued on it; caller holds g_mu. */
void device_sync_locked(void);

#pragma GCC visibility pop

#endif
