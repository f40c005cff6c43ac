/* The stand-in CUDA runtime's memory: "device" and pinned allocations are host memory kept in
 * a table, so copies can be checked against their direction as the real runtime does; copies
 * and memsets are operations on a stream. */
#include "cudart_internal.h"

#include <stdlib.h>
#include <string.h>

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
int mem_kind(const void* p, size_t n) {
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

/* fork(): the child's copy of the lock may be held by a thread that does not exist there. */
void memory_reset_after_fork(void) { pthread_mutex_init(&g_mem_mu, NULL); }

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

/* For the stand-in NCCL: 1 when [p, p+n) lies in one cudaMalloc allocation, 2 in one
 * cudaHostAlloc allocation, 0 for other host memory, -1 when it starts in an allocation and
 * runs past its end. */
EXPORT int standin_cuda_ptr_kind(const void* p, size_t n) { return mem_kind(p, n); }
