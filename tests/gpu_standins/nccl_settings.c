/* The stand-in NCCL's settings (read from the environment once) and its errors: the thread's
 * last error message, printed with NCCL_DEBUG=WARN, and the error strings. */
#include "nccl_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
int g_version = 22305;
long g_fail_after = 0;
static int g_debug = 0;

static void read_env(void) {
  const char* v = getenv("HVDL_STANDIN_NCCL_VERSION");
  if (v && *v) {
    char* end = NULL;
    long x = strtol(v, &end, 10);
    if (end != v && *end == '\0' && x > 0) g_version = (int)x;
  }
  v = getenv("HVDL_STANDIN_NCCL_FAIL_AFTER");
  if (v && *v) {
    char* end = NULL;
    long x = strtol(v, &end, 10);
    if (end != v && *end == '\0' && x > 0) g_fail_after = x;
  }
  v = getenv("NCCL_DEBUG");
  g_debug = v && (!strcasecmp(v, "WARN") || !strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"));
}

void settings(void) { pthread_once(&g_env_once, read_env); }

static __thread char t_last_error[512];

ncclResult_t fail(ncclResult_t rc, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
  va_end(ap);
  settings();
  if (g_debug) {
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "%s:%d:%ld [standin] NCCL WARN %s\n", host, (int)getpid(),
            (long)syscall(SYS_gettid), t_last_error);
  }
  return rc;
}

EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  settings();
  *version = g_version;
  return ncclSuccess;
}

EXPORT const char* ncclGetErrorString(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return t_last_error;
}
