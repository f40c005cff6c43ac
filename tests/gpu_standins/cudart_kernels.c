/* The stand-in CUDA runtime's test hooks that act as kernels: a stream operation that fills
 * device memory (after a delay, to test the ordering rules) or reads it into host memory. */
#include "cudart_internal.h"

#include <stdlib.h>
#include <string.h>

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
