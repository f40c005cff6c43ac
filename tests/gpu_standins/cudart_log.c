/* The stand-in CUDA runtime's log: one line per call and per operation run, numbered in the
 * order they happened, which the tests read (standin_cuda_log) to check the ordering rules. */
#include "cudart_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOG_LIMIT ((size_t)4 << 20)

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
void logf_line(const char* fmt, ...) {
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

/* fork(): the child's copy of the lock may be held by a thread that does not exist there. */
void log_reset_after_fork(void) { pthread_mutex_init(&g_log_mu, NULL); }

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
