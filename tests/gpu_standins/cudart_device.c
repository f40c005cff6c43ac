/* The stand-in CUDA runtime: devices (HVDL_STANDIN_CUDA_DEVICES of them), versions, and the
 * per-thread last error. */
#include "cudart_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STANDIN_VERSION 12080

static __thread cudaError_t t_last_error = cudaSuccess;
static __thread int t_device = 0;

cudaError_t ret(cudaError_t e) {
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

int device_count(void) {
  pthread_once(&g_env_once, read_env);
  return g_devices;
}

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
