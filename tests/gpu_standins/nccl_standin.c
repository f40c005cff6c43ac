/* A stand-in for NCCL (libnccl.so.2) for machines without a GPU.
 *
 * The real C ABI for the subset the core uses. Ranks are processes of one machine: at
 * ncclCommInitRank they form a full mesh of Unix-domain stream sockets (abstract names derived
 * from the unique id), and every operation is a host function put on the caller's stand-in CUDA
 * stream (cudaLaunchHostFunc), so it runs when the stream reaches it, after whatever the stream
 * waits for. Data really moves between the processes; reductions run in rank order, so every
 * rank gets the same bytes. A peer that goes away (dies, aborts) makes the op fail with
 * ncclRemoteError and keeps the stream blocked until ncclCommAbort / ncclCommDestroy, as a
 * hung kernel would.
 *
 * Environment: HVDL_STANDIN_NCCL_VERSION (default 22305) gates ncclAvg (2.10), PreMulSum
 * (2.11) and ncclCommSplit (2.18); HVDL_STANDIN_NCCL_FAIL_AFTER=N makes the Nth operation put
 * on a stream in this process (a call outside a group, or a whole group) fail with
 * ncclSystemError when the stream reaches it; NCCL_DEBUG=WARN prints why calls fail.
 * Build with -DSTANDIN_NCCL_OMIT_ALLGATHER for a library without ncclAllGather. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* From the stand-in CUDA runtime (linked, found through rpath $ORIGIN). */
extern int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* user);
extern int cudaGetDevice(int* device);
extern int cudaEventCreateWithFlags(void** event, unsigned flags);
extern int cudaEventRecord(void* event, void* stream);
extern int cudaStreamWaitEvent(void* stream, void* event, unsigned flags);
extern int cudaEventDestroy(void* event);
/* Weak: with another runtime loaded first, buffers are not checked. */
extern int standin_cuda_ptr_kind(const void* p, size_t n) __attribute__((weak));

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm* ncclComm_t;

enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum { T_INT8, T_UINT8, T_INT32, T_UINT32, T_INT64, T_UINT64, T_F16, T_F32, T_F64, T_BF16, T_NUM };
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_FIRST_USER };
/* Reductions as executed: the user's op resolved (avg on floats is a PreMulSum by 1/n, on
 * integers a sum divided at the end, as in NCCL). */
enum { R_SUM, R_PROD, R_MAX, R_MIN, R_PREMUL, R_SUMDIV };
enum { K_ALLREDUCE = 1, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SEND, K_RECV,
       K_SPLIT };

#define COMM_MAGIC 0x4e43434cu
#define ID_PREFIX "HVDLNCCL1:"
#define TOKEN_HEX 32
#define MSG_MAGIC 0x48564d53u
#define CONNECT_TIMEOUT_MS 30000
#define POLL_MS 100

static const size_t g_type_size[T_NUM] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

/* ------------------------------------------------------------------------------------------ */
/* Settings, diagnostics                                                                        */

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static int g_version = 22305;
static long g_fail_after = 0;
static int g_debug = 0;
static _Atomic long g_units = 0;
static _Atomic uint64_t g_comm_ids = 0;

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

static void settings(void) { pthread_once(&g_env_once, read_env); }

static __thread char t_last_error[512];

static ncclResult_t fail(ncclResult_t rc, const char* fmt, ...) {
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

/* ------------------------------------------------------------------------------------------ */
/* Communicators                                                                                */

struct user_op {
  int used;
  int dtype;
  int residence; /* 1: host immediate (value copied at creation), 0: device pointer */
  unsigned char value[8];
  const void* ptr;
};

struct ncclComm {
  uint32_t magic;
  uint64_t uid; /* lock order when one group uses several comms */
  int nranks, rank, device;
  char root_token[TOKEN_HEX + 1]; /* the unique id's random token */
  char token[80];                 /* this comm's socket names' prefix */
  int split_count;
  /* The wire: one socket per peer and per-direction message counters, used under wire_mu. */
  pthread_mutex_t wire_mu;
  int* fds;
  uint64_t *send_seq, *recv_seq;
  /* State, under mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;      /* the handle, and each launch not yet finished */
  int pending;   /* launches queued or running */
  int released;  /* ncclCommDestroy/Abort called: the handle is gone */
  int closing;   /* ncclCommDestroy in progress */
  _Atomic int aborted;
  int async_error;
  struct user_op* ops;
  int nops;
};

static void close_wire(struct ncclComm* c) {
  for (int p = 0; c->fds && p < c->nranks; p++)
    if (c->fds[p] >= 0) shutdown(c->fds[p], SHUT_RDWR);
  pthread_mutex_lock(&c->wire_mu);
  for (int p = 0; c->fds && p < c->nranks; p++)
    if (c->fds[p] >= 0) {
      close(c->fds[p]);
      c->fds[p] = -1;
    }
  pthread_mutex_unlock(&c->wire_mu);
}

static void comm_free(struct ncclComm* c) {
  close_wire(c);
  c->magic = 0;
  free(c->fds);
  free(c->send_seq);
  free(c->recv_seq);
  free(c->ops);
  pthread_mutex_destroy(&c->wire_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

static void comm_unref(struct ncclComm* c) {
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (last) comm_free(c);
}

static int comm_valid(struct ncclComm* c) {
  return c && c->magic == COMM_MAGIC && !c->released;
}

static void set_async_error(struct ncclComm* c, ncclResult_t rc) {
  pthread_mutex_lock(&c->mu);
  if (c->async_error == ncclSuccess) c->async_error = rc;
  pthread_mutex_unlock(&c->mu);
}

/* What a stream op does after a failure: stays there, as a hung kernel, until the comm is
 * aborted or destroyed. */
static void block_until_released(struct ncclComm* c) {
  pthread_mutex_lock(&c->mu);
  while (!atomic_load(&c->aborted) && !c->closing) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* Connecting                                                                                   */

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static socklen_t socket_name(struct sockaddr_un* a, const char* token, int rank) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  /* Abstract namespace: sun_path[0] = 0, no file. */
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "hvdl-nccl-%s-%d", token, rank);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

struct hello {
  uint32_t magic;
  int32_t rank, nranks;
  char token[80];
};

/* Reads or writes exactly n bytes before the deadline; 0 on success. */
static int io_full(int fd, void* buf, size_t n, int writing, long deadline) {
  char* p = buf;
  while (n > 0) {
    long left = deadline - now_ms();
    if (left <= 0) return -1;
    struct pollfd pf = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
    int pr = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
    if (pr < 0 && errno != EINTR) return -1;
    if (pr <= 0) continue;
    ssize_t k = writing ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, p, n, MSG_DONTWAIT);
    if (k == 0) return -1;
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static void tune_socket(int fd) {
  int size = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
}

/* The mesh: rank r listens, connects to every lower rank, and accepts every higher one. */
static ncclResult_t build_mesh(struct ncclComm* c) {
  int n = c->nranks, r = c->rank;
  c->fds = malloc((size_t)n * sizeof *c->fds);
  c->send_seq = calloc((size_t)n, sizeof *c->send_seq);
  c->recv_seq = calloc((size_t)n, sizeof *c->recv_seq);
  if (!c->fds || !c->send_seq || !c->recv_seq) return fail(ncclSystemError, "out of memory");
  for (int p = 0; p < n; p++) c->fds[p] = -1;
  if (n == 1) return ncclSuccess;
  long deadline = now_ms() + CONNECT_TIMEOUT_MS;
  struct sockaddr_un addr;
  socklen_t len;
  int lfd = -1;
  ncclResult_t rc = ncclSuccess;
  if (r < n - 1) {
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) return fail(ncclSystemError, "socket: %s", strerror(errno));
    len = socket_name(&addr, c->token, r);
    if (bind(lfd, (struct sockaddr*)&addr, len) != 0) {
      int e = errno;
      close(lfd);
      return fail(e == EADDRINUSE ? ncclInvalidUsage : ncclSystemError,
                  "ncclCommInitRank: rank %d of this unique id is taken (%s)", r, strerror(e));
    }
    if (listen(lfd, n) != 0) {
      close(lfd);
      return fail(ncclSystemError, "listen: %s", strerror(errno));
    }
  }
  struct hello me = {MSG_MAGIC, r, n, {0}};
  snprintf(me.token, sizeof me.token, "%s", c->token);
  for (int p = 0; p < r && rc == ncclSuccess; p++) {
    len = socket_name(&addr, c->token, p);
    for (;;) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        rc = fail(ncclSystemError, "socket: %s", strerror(errno));
        break;
      }
      tune_socket(fd);
      if (connect(fd, (struct sockaddr*)&addr, len) == 0) {
        if (io_full(fd, &me, sizeof me, 1, deadline) != 0) {
          close(fd);
          rc = fail(ncclSystemError, "ncclCommInitRank: rank %d: lost rank %d while connecting",
                    r, p);
        } else {
          c->fds[p] = fd;
        }
        break;
      }
      int e = errno;
      close(fd);
      if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) ||
          now_ms() >= deadline) {
        rc = fail(ncclSystemError,
                  "ncclCommInitRank: rank %d could not reach rank %d of %d within %d s (%s)", r,
                  p, n, CONNECT_TIMEOUT_MS / 1000, strerror(e));
        break;
      }
      struct timespec ts = {0, 5 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  for (int accepted = 0; rc == ncclSuccess && accepted < n - 1 - r;) {
    long left = deadline - now_ms();
    if (left <= 0) {
      rc = fail(ncclSystemError,
                "ncclCommInitRank: rank %d: %d of %d ranks did not join within %d s", r,
                n - 1 - r - accepted, n, CONNECT_TIMEOUT_MS / 1000);
      break;
    }
    struct pollfd pf = {lfd, POLLIN, 0};
    int pr = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
    if (pr <= 0) continue;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    tune_socket(fd);
    struct hello h;
    memset(&h, 0, sizeof h);
    if (io_full(fd, &h, sizeof h, 0, deadline) != 0 || h.magic != MSG_MAGIC || h.nranks != n ||
        h.rank <= r || h.rank >= n || c->fds[h.rank] >= 0 ||
        strncmp(h.token, c->token, sizeof h.token) != 0) {
      int mismatch = h.magic == MSG_MAGIC && h.nranks != n;
      close(fd);
      if (mismatch) {
        rc = fail(ncclInvalidUsage, "ncclCommInitRank: ranks disagree on nranks (%d, %d)", n,
                  (int)h.nranks);
        break;
      }
      continue;
    }
    c->fds[h.rank] = fd;
    accepted++;
  }
  if (lfd >= 0) close(lfd);
  if (rc != ncclSuccess) {
    for (int p = 0; p < n; p++)
      if (c->fds[p] >= 0) {
        close(c->fds[p]);
        c->fds[p] = -1;
      }
  }
  return rc;
}

static ncclResult_t comm_create(struct ncclComm** out, int nranks, int rank, const char* root_token,
                                const char* token) {
  int device = 0;
  if (cudaGetDevice(&device) != 0)
    return fail(ncclUnhandledCudaError, "ncclCommInitRank: no usable CUDA device");
  struct ncclComm* c = calloc(1, sizeof *c);
  if (!c) return fail(ncclSystemError, "out of memory");
  c->magic = COMM_MAGIC;
  c->uid = atomic_fetch_add(&g_comm_ids, 1) + 1;
  c->nranks = nranks;
  c->rank = rank;
  c->device = device;
  snprintf(c->root_token, sizeof c->root_token, "%s", root_token);
  snprintf(c->token, sizeof c->token, "%s", token);
  c->refs = 1;
  pthread_mutex_init(&c->wire_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  ncclResult_t rc = build_mesh(c);
  if (rc != ncclSuccess) {
    comm_free(c);
    return rc;
  }
  *out = c;
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* Arithmetic                                                                                   */

static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, f;
  if (exp == 0) {
    if (man == 0) {
      f = sign;
    } else {
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      f = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    f = sign | 0x7f800000u | (man << 13);
  } else {
    f = sign | ((exp + 112) << 23) | (man << 13);
  }
  float out;
  memcpy(&out, &f, 4);
  return out;
}

/* Round to nearest even, as NumPy's float -> half. */
static uint16_t f2h(float value) {
  uint32_t f;
  memcpy(&f, &value, 4);
  uint16_t sign = (uint16_t)((f & 0x80000000u) >> 16);
  uint32_t f_exp = f & 0x7f800000u, f_sig;
  if (f_exp >= 0x47800000u) {
    if (f_exp == 0x7f800000u && (f & 0x007fffffu)) {
      uint16_t r = (uint16_t)(0x7c00u + ((f & 0x007fffffu) >> 13));
      if (r == 0x7c00u) r++;
      return (uint16_t)(sign + r);
    }
    return (uint16_t)(sign + 0x7c00u);
  }
  if (f_exp <= 0x38000000u) {
    if (f_exp < 0x33000000u) return sign;
    f_exp >>= 23;
    f_sig = 0x00800000u + (f & 0x007fffffu);
    f_sig >>= (113 - f_exp);
    if (((f_sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu)) f_sig += 0x00001000u;
    return (uint16_t)(sign + (uint16_t)(f_sig >> 13));
  }
  uint16_t h_exp = (uint16_t)((f_exp - 0x38000000u) >> 13);
  f_sig = f & 0x007fffffu;
  if ((f_sig & 0x00003fffu) != 0x00001000u) f_sig += 0x00001000u;
  return (uint16_t)(sign + h_exp + (uint16_t)(f_sig >> 13));
}

static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f2bf(float value) {
  uint32_t u;
  memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* acc = first ? pre(x) : acc (op) pre(x), elementwise; pre multiplies by the scalar for
 * R_PREMUL. Integers wrap around; 16-bit floats compute in float and round to nearest even
 * after each operation. */
#define INT_LOOP(T, UT)                                                             \
  do {                                                                              \
    T* a = acc;                                                                     \
    const T* b = x;                                                                 \
    T s;                                                                            \
    memcpy(&s, scalar, sizeof s);                                                   \
    for (size_t i = 0; i < count; i++) {                                            \
      T v = red == R_PREMUL ? (T)((UT)b[i] * (UT)s) : b[i];                         \
      if (first) {                                                                  \
        a[i] = v;                                                                   \
        continue;                                                                   \
      }                                                                             \
      switch (red) {                                                                \
        case R_PROD: a[i] = (T)((UT)a[i] * (UT)v); break;                           \
        case R_MAX: a[i] = v > a[i] ? v : a[i]; break;                              \
        case R_MIN: a[i] = v < a[i] ? v : a[i]; break;                              \
        default: a[i] = (T)((UT)a[i] + (UT)v); break;                               \
      }                                                                             \
    }                                                                               \
  } while (0)

#define FLOAT_LOOP(T, MAXF, MINF)                                                   \
  do {                                                                              \
    T* a = acc;                                                                     \
    const T* b = x;                                                                 \
    T s;                                                                            \
    memcpy(&s, scalar, sizeof s);                                                   \
    for (size_t i = 0; i < count; i++) {                                            \
      T v = red == R_PREMUL ? b[i] * s : b[i];                                      \
      if (first) {                                                                  \
        a[i] = v;                                                                   \
        continue;                                                                   \
      }                                                                             \
      switch (red) {                                                                \
        case R_PROD: a[i] = a[i] * v; break;                                        \
        case R_MAX: a[i] = MAXF(a[i], v); break;                                    \
        case R_MIN: a[i] = MINF(a[i], v); break;                                    \
        default: a[i] = a[i] + v; break;                                            \
      }                                                                             \
    }                                                                               \
  } while (0)

#define HALF_LOOP(TO_F, FROM_F)                                                     \
  do {                                                                              \
    uint16_t* a = acc;                                                              \
    const uint16_t* b = x;                                                          \
    uint16_t sbits;                                                                 \
    memcpy(&sbits, scalar, sizeof sbits);                                           \
    float s = TO_F(sbits);                                                          \
    for (size_t i = 0; i < count; i++) {                                            \
      uint16_t v = red == R_PREMUL ? FROM_F(TO_F(b[i]) * s) : b[i];                 \
      if (first) {                                                                  \
        a[i] = v;                                                                   \
        continue;                                                                   \
      }                                                                             \
      float fa = TO_F(a[i]), fv = TO_F(v);                                          \
      switch (red) {                                                                \
        case R_PROD: a[i] = FROM_F(fa * fv); break;                                 \
        case R_MAX: a[i] = FROM_F(fmaxf(fa, fv)); break;                            \
        case R_MIN: a[i] = FROM_F(fminf(fa, fv)); break;                            \
        default: a[i] = FROM_F(fa + fv); break;                                     \
      }                                                                             \
    }                                                                               \
  } while (0)

static void accumulate(void* acc, const void* x, size_t count, int dtype, int red,
                       const unsigned char* scalar, int first) {
  switch (dtype) {
    case T_INT8: INT_LOOP(int8_t, uint8_t); break;
    case T_UINT8: INT_LOOP(uint8_t, uint8_t); break;
    case T_INT32: INT_LOOP(int32_t, uint32_t); break;
    case T_UINT32: INT_LOOP(uint32_t, uint32_t); break;
    case T_INT64: INT_LOOP(int64_t, uint64_t); break;
    case T_UINT64: INT_LOOP(uint64_t, uint64_t); break;
    case T_F32: FLOAT_LOOP(float, fmaxf, fminf); break;
    case T_F64: FLOAT_LOOP(double, fmax, fmin); break;
    case T_F16: HALF_LOOP(h2f, f2h); break;
    case T_BF16: HALF_LOOP(bf2f, f2bf); break;
  }
}

/* ncclAvg on integers: the sum divided by the rank count, rounding toward zero. */
#define DIV_LOOP(T)                                    \
  do {                                                 \
    T* a = acc;                                        \
    for (size_t i = 0; i < count; i++) a[i] = (T)(a[i] / (T)n); \
  } while (0)

static void divide(void* acc, size_t count, int dtype, int n) {
  switch (dtype) {
    case T_INT8: DIV_LOOP(int8_t); break;
    case T_UINT8: DIV_LOOP(uint8_t); break;
    case T_INT32: DIV_LOOP(int32_t); break;
    case T_UINT32: DIV_LOOP(uint32_t); break;
    case T_INT64: DIV_LOOP(int64_t); break;
    case T_UINT64: DIV_LOOP(uint64_t); break;
  }
}

/* The scalar 1/n in the type, as NCCL computes it for ncclAvg on floating-point types. */
static void avg_scalar(int dtype, int n, unsigned char* out) {
  memset(out, 0, 8);
  float f = (float)(1.0 / n);
  double d = 1.0 / n;
  uint16_t h;
  switch (dtype) {
    case T_F32: memcpy(out, &f, 4); break;
    case T_F64: memcpy(out, &d, 8); break;
    case T_F16: h = f2h(f); memcpy(out, &h, 2); break;
    case T_BF16: h = f2bf(f); memcpy(out, &h, 2); break;
  }
}

static int is_float(int dtype) {
  return dtype == T_F16 || dtype == T_F32 || dtype == T_F64 || dtype == T_BF16;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                   */

struct coll {
  int kind;
  struct ncclComm* comm;
  void* stream;
  const void* sendbuff;
  void* recvbuff;
  size_t count; /* elements: per rank for allgather (send) and reducescatter (recv) */
  int dtype;
  int peer;     /* root, or the p2p peer */
  int user_op;  /* as given, for the wire check */
  int red;      /* resolved R_* */
  unsigned char scalar[8];
  const void* scalar_ptr; /* PreMulSum with a device scalar: read when the op runs */
};

struct launch {
  struct coll* ops;
  int nops, cap;
  int fail; /* HVDL_STANDIN_NCCL_FAIL_AFTER chose this one */
  struct ncclComm** comms; /* distinct, in lock order */
  int ncomms;
};

static int launch_add(struct launch* L, const struct coll* op) {
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

static void launch_free(struct launch* L) {
  if (!L) return;
  free(L->ops);
  free(L->comms);
  free(L);
}

/* The message header: each side checks what it receives against what it expects, so calls
 * that do not match across ranks are detected instead of mixing up data. */
struct header {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;
  uint64_t bytes;
  uint64_t count;
  int32_t dtype, op, root, reserved;
  unsigned char scalar[8]; /* the sender's PreMulSum factor: each rank scales its own input */
};

struct send_item {
  struct header h;
  const char* data;
  size_t done;
};

struct recv_item {
  struct header expect, got;
  char* buf;
  size_t done;
  unsigned char* scalar; /* where the sender's factor goes, or NULL */
};

struct chan {
  struct ncclComm* comm;
  int peer;
  struct send_item* sends;
  int ns, si, scap;
  struct recv_item* recvs;
  int nr, ri, rcap;
};

struct plan {
  struct chan* ch;
  int nch, cap;
  void** tmp; /* buffers to free */
  int ntmp, tmpcap;
  int oom;
};

static struct chan* plan_chan(struct plan* P, struct ncclComm* c, int peer) {
  for (int i = 0; i < P->nch; i++)
    if (P->ch[i].comm == c && P->ch[i].peer == peer) return &P->ch[i];
  if (P->nch == P->cap) {
    int cap = P->cap ? P->cap * 2 : 8;
    struct chan* p = realloc(P->ch, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    P->ch = p;
    P->cap = cap;
  }
  struct chan* ch = &P->ch[P->nch++];
  memset(ch, 0, sizeof *ch);
  ch->comm = c;
  ch->peer = peer;
  return ch;
}

static void* plan_tmp(struct plan* P, size_t n) {
  if (P->ntmp == P->tmpcap) {
    int cap = P->tmpcap ? P->tmpcap * 2 : 8;
    void** t = realloc(P->tmp, (size_t)cap * sizeof *t);
    if (!t) {
      P->oom = 1;
      return NULL;
    }
    P->tmp = t;
    P->tmpcap = cap;
  }
  void* b = malloc(n ? n : 1);
  if (!b) {
    P->oom = 1;
    return NULL;
  }
  P->tmp[P->ntmp++] = b;
  return b;
}

static struct header make_header(const struct coll* op, uint64_t bytes) {
  struct header h;
  memset(&h, 0, sizeof h);
  h.magic = MSG_MAGIC;
  h.kind = (uint32_t)(op->kind == K_RECV ? K_SEND : op->kind);
  h.bytes = bytes;
  h.count = op->count;
  h.dtype = op->dtype;
  h.op = op->kind == K_ALLREDUCE || op->kind == K_REDUCE || op->kind == K_REDUCESCATTER
             ? op->red
             : -1;
  h.root = op->kind == K_BROADCAST || op->kind == K_REDUCE ? op->peer : -1;
  memcpy(h.scalar, op->scalar, sizeof h.scalar);
  return h;
}

static void plan_send(struct plan* P, const struct coll* op, int peer, const void* data,
                      uint64_t bytes) {
  struct chan* ch = plan_chan(P, op->comm, peer);
  if (!ch) {
    P->oom = 1;
    return;
  }
  if (ch->ns == ch->scap) {
    int cap = ch->scap ? ch->scap * 2 : 4;
    struct send_item* s = realloc(ch->sends, (size_t)cap * sizeof *s);
    if (!s) {
      P->oom = 1;
      return;
    }
    ch->sends = s;
    ch->scap = cap;
  }
  struct send_item* it = &ch->sends[ch->ns++];
  it->h = make_header(op, bytes);
  it->h.seq = op->comm->send_seq[peer]++;
  it->data = data;
  it->done = 0;
}

static void* plan_recv(struct plan* P, const struct coll* op, int peer, uint64_t bytes,
                       unsigned char* scalar) {
  struct chan* ch = plan_chan(P, op->comm, peer);
  void* buf = plan_tmp(P, bytes);
  if (!ch || !buf) {
    P->oom = 1;
    return NULL;
  }
  if (ch->nr == ch->rcap) {
    int cap = ch->rcap ? ch->rcap * 2 : 4;
    struct recv_item* r = realloc(ch->recvs, (size_t)cap * sizeof *r);
    if (!r) {
      P->oom = 1;
      return NULL;
    }
    ch->recvs = r;
    ch->rcap = cap;
  }
  struct recv_item* it = &ch->recvs[ch->nr++];
  memset(it, 0, sizeof *it);
  it->expect = make_header(op, bytes);
  it->expect.seq = op->comm->recv_seq[peer]++;
  it->buf = buf;
  it->scalar = scalar;
  return buf;
}

static void plan_free(struct plan* P) {
  for (int i = 0; i < P->nch; i++) {
    free(P->ch[i].sends);
    free(P->ch[i].recvs);
  }
  free(P->ch);
  for (int i = 0; i < P->ntmp; i++) free(P->tmp[i]);
  free(P->tmp);
}

enum { XCHG_OK = 0, XCHG_ABORTED = -1 };

static int pump_send(struct chan* ch, int fd) {
  while (ch->si < ch->ns) {
    struct send_item* it = &ch->sends[ch->si];
    size_t hs = sizeof it->h, total = hs + it->h.bytes;
    struct iovec iov[2];
    int k = 0;
    if (it->done < hs) {
      iov[k].iov_base = (char*)&it->h + it->done;
      iov[k++].iov_len = hs - it->done;
      if (it->h.bytes) {
        iov[k].iov_base = (void*)it->data;
        iov[k++].iov_len = it->h.bytes;
      }
    } else {
      iov[k].iov_base = (void*)(it->data + (it->done - hs));
      iov[k++].iov_len = total - it->done;
    }
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)k;
    ssize_t w = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      return fail(ncclRemoteError, "rank %d: sending to rank %d failed: %s", ch->comm->rank,
                  ch->peer, strerror(errno));
    }
    it->done += (size_t)w;
    if (it->done == total) ch->si++;
  }
  return 0;
}

static int header_ok(const struct header* got, const struct header* want) {
  if (got->magic != MSG_MAGIC || got->seq != want->seq || got->kind != want->kind) return 0;
  if (got->bytes != want->bytes) return 0;
  if (want->kind == K_SEND || want->kind == K_SPLIT) return 1;
  return got->count == want->count && got->dtype == want->dtype && got->op == want->op &&
         got->root == want->root;
}

static const char* kind_name(uint32_t k) {
  switch (k) {
    case K_ALLREDUCE: return "allreduce";
    case K_BROADCAST: return "broadcast";
    case K_REDUCE: return "reduce";
    case K_ALLGATHER: return "allgather";
    case K_REDUCESCATTER: return "reducescatter";
    case K_SEND: return "send/recv";
    case K_SPLIT: return "split";
    default: return "?";
  }
}

static int pump_recv(struct chan* ch, int fd) {
  while (ch->ri < ch->nr) {
    struct recv_item* it = &ch->recvs[ch->ri];
    size_t hs = sizeof it->got;
    char* p;
    size_t want;
    if (it->done < hs) {
      p = (char*)&it->got + it->done;
      want = hs - it->done;
    } else {
      p = it->buf + (it->done - hs);
      want = hs + it->expect.bytes - it->done;
    }
    ssize_t k = want ? recv(fd, p, want, MSG_DONTWAIT) : 0;
    if (want && k == 0)
      return fail(ncclRemoteError, "rank %d: rank %d closed the connection", ch->comm->rank,
                  ch->peer);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      return fail(ncclRemoteError, "rank %d: receiving from rank %d failed: %s", ch->comm->rank,
                  ch->peer, strerror(errno));
    }
    size_t before = it->done;
    it->done += (size_t)k;
    if (before < hs && it->done >= hs && it->scalar)
      memcpy(it->scalar, it->got.scalar, sizeof it->got.scalar);
    if (before < hs && it->done >= hs && !header_ok(&it->got, &it->expect))
      return fail(ncclInvalidUsage,
                  "rank %d: mismatched calls with rank %d: expected %s #%llu of %llu bytes "
                  "(count %llu, dtype %d, op %d, root %d), rank %d issued %s #%llu of %llu bytes "
                  "(count %llu, dtype %d, op %d, root %d)",
                  ch->comm->rank, ch->peer, kind_name(it->expect.kind),
                  (unsigned long long)it->expect.seq, (unsigned long long)it->expect.bytes,
                  (unsigned long long)it->expect.count, it->expect.dtype, it->expect.op,
                  it->expect.root, ch->peer, kind_name(it->got.kind),
                  (unsigned long long)it->got.seq, (unsigned long long)it->got.bytes,
                  (unsigned long long)it->got.count, it->got.dtype, it->got.op, it->got.root);
    if (it->done == hs + it->expect.bytes) ch->ri++;
  }
  return 0;
}

/* Moves every planned message, all channels at once (no ordering between peers, so no
 * deadlock). Returns XCHG_OK, XCHG_ABORTED, or an NCCL error with *bad = the comm it concerns. The
 * caller holds the wires of all the plan's comms. */
static int run_plan(struct plan* P, struct ncclComm** bad) {
  struct pollfd* pf = malloc(((size_t)P->nch + 1) * sizeof *pf);
  int* which = malloc(((size_t)P->nch + 1) * sizeof *which);
  int rc = XCHG_OK;
  if (!pf || !which) {
    rc = fail(ncclSystemError, "out of memory");
    *bad = P->nch ? P->ch[0].comm : NULL;
    goto out;
  }
  for (;;) {
    int k = 0;
    for (int i = 0; i < P->nch; i++) {
      struct chan* ch = &P->ch[i];
      if (atomic_load(&ch->comm->aborted)) {
        rc = XCHG_ABORTED;
        goto out;
      }
      short ev = (short)((ch->si < ch->ns ? POLLOUT : 0) | (ch->ri < ch->nr ? POLLIN : 0));
      if (!ev) continue;
      int fd = ch->comm->fds[ch->peer];
      if (fd < 0) {
        rc = fail(ncclRemoteError, "rank %d: no connection to rank %d", ch->comm->rank, ch->peer);
        *bad = ch->comm;
        goto out;
      }
      pf[k].fd = fd;
      pf[k].events = ev;
      pf[k].revents = 0;
      which[k++] = i;
    }
    if (k == 0) break;
    int pr = poll(pf, (nfds_t)k, POLL_MS);
    if (pr < 0 && errno != EINTR) {
      rc = fail(ncclSystemError, "poll: %s", strerror(errno));
      *bad = P->ch[which[0]].comm;
      goto out;
    }
    /* Every send first, then every receive: all headers go out before a mismatch found in
     * one of them stops this rank, so every peer detects the mismatch too. */
    for (int pass = 0; pr > 0 && pass < 2; pass++) {
      for (int j = 0; j < k; j++) {
        struct chan* ch = &P->ch[which[j]];
        short re = pf[j].revents;
        int e = 0;
        if (pass == 0 && ch->si < ch->ns && (re & (POLLOUT | POLLERR | POLLHUP)))
          e = pump_send(ch, pf[j].fd);
        if (pass == 1 && ch->ri < ch->nr && (re & (POLLIN | POLLERR | POLLHUP)))
          e = pump_recv(ch, pf[j].fd);
        if (!e && pass == 1 && (re & POLLNVAL))
          e = fail(ncclRemoteError, "rank %d: connection to rank %d is gone", ch->comm->rank,
                   ch->peer);
        if (e) {
          rc = e;
          *bad = ch->comm;
          goto out;
        }
      }
    }
  }
out:
  free(pf);
  free(which);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Running a launch (on the stream's worker)                                                    */

/* Plans one op's messages; returns the per-peer receive buffers through recv[] (NULL for the
 * own rank). */
struct self_msg {
  const void* data;
  uint64_t bytes;
};

static void plan_op(struct plan* P, const struct coll* op, void** recv, unsigned char* scal,
                    struct self_msg** self_q, int* self_n, int* self_cap) {
  struct ncclComm* c = op->comm;
  int n = c->nranks, r = c->rank;
  size_t es = g_type_size[op->dtype];
  uint64_t nb = (uint64_t)op->count * es;
  for (int p = 0; p < n; p++) recv[p] = NULL;
  switch (op->kind) {
    case K_ALLREDUCE:
    case K_ALLGATHER:
      for (int p = 0; p < n; p++)
        if (p != r) {
          plan_send(P, op, p, op->sendbuff, nb);
          recv[p] = plan_recv(P, op, p, nb, scal + 8 * p);
        }
      break;
    case K_REDUCESCATTER:
      for (int p = 0; p < n; p++)
        if (p != r) {
          plan_send(P, op, p, (const char*)op->sendbuff + (size_t)p * nb, nb);
          recv[p] = plan_recv(P, op, p, nb, scal + 8 * p);
        }
      break;
    case K_BROADCAST:
      if (r == op->peer) {
        for (int p = 0; p < n; p++)
          if (p != r) plan_send(P, op, p, op->sendbuff, nb);
      } else {
        recv[op->peer] = plan_recv(P, op, op->peer, nb, NULL);
      }
      break;
    case K_REDUCE:
      if (r == op->peer) {
        for (int p = 0; p < n; p++)
          if (p != r) recv[p] = plan_recv(P, op, p, nb, scal + 8 * p);
      } else {
        plan_send(P, op, op->peer, op->sendbuff, nb);
      }
      break;
    case K_SEND:
      if (op->peer != r) {
        plan_send(P, op, op->peer, op->sendbuff, nb);
      } else {
        /* To self: a snapshot now, matched in order with the receives from self. */
        void* copy = plan_tmp(P, nb);
        if (copy && nb) memcpy(copy, op->sendbuff, nb);
        if (*self_n == *self_cap) {
          int cap = *self_cap ? *self_cap * 2 : 4;
          struct self_msg* q = realloc(*self_q, (size_t)cap * sizeof *q);
          if (!q) {
            P->oom = 1;
            return;
          }
          *self_q = q;
          *self_cap = cap;
        }
        (*self_q)[*self_n].data = copy;
        (*self_q)[(*self_n)++].bytes = nb;
      }
      break;
    case K_RECV:
      if (op->peer != r) recv[op->peer] = plan_recv(P, op, op->peer, nb, NULL);
      break;
  }
}

/* Reduces the ranks' contributions in rank order into out; scal[q]: rank q's factor. */
static int reduce_ranks(struct coll* op, void** recv, const unsigned char* scal, const char* own,
                        void* out) {
  struct ncclComm* c = op->comm;
  size_t nb = op->count * g_type_size[op->dtype];
  void* acc = malloc(nb ? nb : 1);
  if (!acc) return -1;
  for (int q = 0; q < c->nranks; q++) {
    const void* src = q == c->rank ? own : recv[q];
    const unsigned char* factor = q == c->rank ? op->scalar : scal + 8 * q;
    accumulate(acc, src, op->count, op->dtype, op->red == R_SUMDIV ? R_SUM : op->red, factor,
               q == 0);
  }
  if (op->red == R_SUMDIV) divide(acc, op->count, op->dtype, c->nranks);
  if (nb) memcpy(out, acc, nb);
  free(acc);
  return 0;
}

/* Communicates, then writes every op's output, in op order. */
static int execute(struct launch* L, struct ncclComm** bad) {
  struct plan P;
  memset(&P, 0, sizeof P);
  int maxn = 1;
  for (int i = 0; i < L->ncomms; i++)
    if (L->comms[i]->nranks > maxn) maxn = L->comms[i]->nranks;
  void** recvs = calloc((size_t)L->nops * (size_t)maxn, sizeof *recvs);
  unsigned char* scals = calloc((size_t)L->nops * (size_t)maxn, 8);
  struct self_msg* self_q = NULL;
  int self_n = 0, self_cap = 0, self_used = 0;
  int rc = XCHG_OK;
  *bad = NULL;
  if (!recvs || !scals) {
    free(recvs);
    free(scals);
    *bad = L->comms[0];
    return fail(ncclSystemError, "out of memory");
  }
  for (int i = 0; i < L->ncomms; i++) pthread_mutex_lock(&L->comms[i]->wire_mu);
  for (int i = 0; i < L->ncomms; i++)
    if (atomic_load(&L->comms[i]->aborted)) rc = XCHG_ABORTED;
  if (rc == XCHG_OK) {
    for (int i = 0; i < L->nops; i++) {
      struct coll* op = &L->ops[i];
      if (op->red == R_PREMUL && op->scalar_ptr) /* a device scalar: read when the op runs */
        memcpy(op->scalar, op->scalar_ptr, g_type_size[op->dtype]);
      plan_op(&P, op, recvs + (size_t)i * (size_t)maxn, scals + (size_t)i * (size_t)maxn * 8,
              &self_q, &self_n, &self_cap);
    }
    if (P.oom) {
      rc = fail(ncclSystemError, "out of memory");
      *bad = L->comms[0];
    } else {
      rc = run_plan(&P, bad);
    }
  }
  for (int i = L->ncomms - 1; i >= 0; i--) pthread_mutex_unlock(&L->comms[i]->wire_mu);
  for (int i = 0; rc == XCHG_OK && i < L->nops; i++) {
    struct coll* op = &L->ops[i];
    struct ncclComm* c = op->comm;
    void** recv = recvs + (size_t)i * (size_t)maxn;
    const unsigned char* scal = scals + (size_t)i * (size_t)maxn * 8;
    size_t es = g_type_size[op->dtype], nb = op->count * es;
    switch (op->kind) {
      case K_ALLREDUCE:
        if (reduce_ranks(op, recv, scal, op->sendbuff, op->recvbuff) != 0) rc = ncclSystemError;
        break;
      case K_REDUCE:
        if (c->rank == op->peer && reduce_ranks(op, recv, scal, op->sendbuff, op->recvbuff) != 0)
          rc = ncclSystemError;
        break;
      case K_REDUCESCATTER:
        if (reduce_ranks(op, recv, scal, (const char*)op->sendbuff + (size_t)c->rank * nb,
                         op->recvbuff) != 0)
          rc = ncclSystemError;
        break;
      case K_BROADCAST:
        if (!nb) break;
        if (c->rank == op->peer) {
          if (op->recvbuff != op->sendbuff) memmove(op->recvbuff, op->sendbuff, nb);
        } else {
          memcpy(op->recvbuff, recv[op->peer], nb);
        }
        break;
      case K_ALLGATHER:
        if (!nb) break;
        memmove((char*)op->recvbuff + (size_t)c->rank * nb, op->sendbuff, nb);
        for (int q = 0; q < c->nranks; q++)
          if (q != c->rank) memcpy((char*)op->recvbuff + (size_t)q * nb, recv[q], nb);
        break;
      case K_RECV:
        if (op->peer != c->rank) {
          if (nb) memcpy(op->recvbuff, recv[op->peer], nb);
        } else if (self_used < self_n && self_q[self_used].bytes == nb) {
          if (nb) memcpy(op->recvbuff, self_q[self_used].data, nb);
          self_used++;
        } else {
          rc = fail(ncclInvalidUsage,
                    "rank %d: ncclRecv of %zu bytes from itself without a matching ncclSend",
                    c->rank, nb);
          *bad = c;
        }
        break;
      default:
        break;
    }
    if (rc == ncclSystemError && !*bad) {
      fail(ncclSystemError, "out of memory");
      *bad = c;
    }
  }
  plan_free(&P);
  free(recvs);
  free(scals);
  free(self_q);
  return rc;
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
static ncclResult_t launch_submit(struct launch* L) {
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

/* ------------------------------------------------------------------------------------------ */
/* Groups (per thread, as in NCCL)                                                              */

static __thread int t_group_depth = 0;
static __thread struct launch* t_group = NULL;
static __thread ncclResult_t t_group_error = ncclSuccess;

EXPORT ncclResult_t ncclGroupStart(void) {
  t_group_depth++;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth == 0)
    return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group started by ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  struct launch* L = t_group;
  ncclResult_t err = t_group_error;
  t_group = NULL;
  t_group_error = ncclSuccess;
  if (err != ncclSuccess) {
    launch_free(L);
    return err;
  }
  return L ? launch_submit(L) : ncclSuccess;
}

static ncclResult_t issue(const struct coll* op) {
  if (t_group_depth > 0) {
    if (!t_group) t_group = calloc(1, sizeof *t_group);
    if (!t_group || launch_add(t_group, op) != 0) {
      if (t_group_error == ncclSuccess) t_group_error = ncclSystemError;
      return fail(ncclSystemError, "out of memory");
    }
    return ncclSuccess;
  }
  struct launch* L = calloc(1, sizeof *L);
  if (!L || launch_add(L, op) != 0) {
    launch_free(L);
    return fail(ncclSystemError, "out of memory");
  }
  return launch_submit(L);
}

/* A failed call inside a group also fails the group's ncclGroupEnd (and drops the group). */
static ncclResult_t call_error(ncclResult_t rc) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = rc;
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Argument checks                                                                              */

static ncclResult_t check_comm(struct ncclComm* c, const char* name) {
  if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", name);
  if (c->magic != COMM_MAGIC || c->released)
    return fail(ncclInvalidArgument, "%s: comm is not a live communicator", name);
  pthread_mutex_lock(&c->mu);
  int err = c->async_error;
  pthread_mutex_unlock(&c->mu);
  if (err) return fail(err, "%s: the communicator has an error (%d); abort it", name, err);
  return ncclSuccess;
}

static ncclResult_t check_buffer(const void* p, size_t bytes, const char* what, const char* name) {
  if (bytes == 0 || !standin_cuda_ptr_kind) return ncclSuccess;
  int kind = standin_cuda_ptr_kind(p, bytes);
  if (kind == 1 || kind == 2) return ncclSuccess;
  if (kind < 0)
    return fail(ncclInvalidArgument, "%s: %s %p + %zu bytes runs past its allocation", name, what,
                p, bytes);
  return fail(ncclInvalidArgument, "%s: %s %p is not device memory", name, what, p);
}

/* Resolves the user's op into op->red and its scalar. */
static ncclResult_t resolve_op(struct coll* op, int user_op, const char* name) {
  struct ncclComm* c = op->comm;
  op->user_op = user_op;
  memset(op->scalar, 0, sizeof op->scalar);
  op->scalar_ptr = NULL;
  switch (user_op) {
    case OP_SUM: op->red = R_SUM; return ncclSuccess;
    case OP_PROD: op->red = R_PROD; return ncclSuccess;
    case OP_MAX: op->red = R_MAX; return ncclSuccess;
    case OP_MIN: op->red = R_MIN; return ncclSuccess;
    case OP_AVG:
      if (g_version < 21000)
        return fail(ncclInvalidArgument, "%s: ncclAvg needs NCCL 2.10 (this is %d)", name,
                    g_version);
      if (is_float(op->dtype)) {
        op->red = R_PREMUL;
        avg_scalar(op->dtype, c->nranks, op->scalar);
      } else {
        op->red = R_SUMDIV;
      }
      return ncclSuccess;
  }
  if (user_op < OP_FIRST_USER)
    return fail(ncclInvalidArgument, "%s: invalid reduction operation %d", name, user_op);
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&c->mu);
  int ix = user_op - OP_FIRST_USER;
  if (ix >= c->nops || !c->ops[ix].used) {
    rc = fail(ncclInvalidArgument, "%s: reduction operation %d unknown to this communicator",
              name, user_op);
  } else if (c->ops[ix].dtype != op->dtype) {
    rc = fail(ncclInvalidArgument, "%s: reduction operation %d was created for datatype %d, not %d",
              name, user_op, c->ops[ix].dtype, op->dtype);
  } else {
    op->red = R_PREMUL;
    if (c->ops[ix].residence == 1)
      memcpy(op->scalar, c->ops[ix].value, sizeof op->scalar);
    else
      op->scalar_ptr = c->ops[ix].ptr;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static ncclResult_t common_checks(struct coll* op, const char* name) {
  settings();
  ncclResult_t rc = check_comm(op->comm, name);
  if (rc) return rc;
  if (op->dtype < 0 || op->dtype >= T_NUM)
    return fail(ncclInvalidArgument, "%s: invalid type %d", name, op->dtype);
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* The API                                                                                      */

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

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  unsigned char raw[TOKEN_HEX / 2];
  size_t got = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    while (got < sizeof raw) {
      ssize_t k = read(fd, raw + got, sizeof raw - got);
      if (k <= 0) break;
      got += (size_t)k;
    }
    close(fd);
  }
  if (got < sizeof raw) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40) ^
                 (uint64_t)(uintptr_t)id;
    for (size_t i = 0; i < sizeof raw; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      raw[i] = (unsigned char)x;
    }
  }
  memset(id, 0, sizeof *id);
  int k = snprintf(id->internal, sizeof id->internal, "%s", ID_PREFIX);
  for (size_t i = 0; i < sizeof raw; i++)
    k += snprintf(id->internal + k, sizeof id->internal - (size_t)k, "%02x", raw[i]);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  settings();
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  if (nranks < 1) return fail(ncclInvalidArgument, "ncclCommInitRank: invalid nranks %d", nranks);
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d is not in 0..%d", rank, nranks - 1);
  size_t plen = strlen(ID_PREFIX);
  char token[TOKEN_HEX + 1];
  if (memcmp(id.internal, ID_PREFIX, plen) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is not from ncclGetUniqueId");
  for (int i = 0; i < TOKEN_HEX; i++) {
    char ch = id.internal[plen + (size_t)i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
      return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is corrupt");
    token[i] = ch;
  }
  token[TOKEN_HEX] = '\0';
  *comm = NULL;
  return comm_create(comm, nranks, rank, token, token);
}

/* Waits for the comm's queued work, then does the exchange on the comm's wire under its lock
 * (no stream op can interleave). */
static ncclResult_t exchange_split(struct ncclComm* c, int color, int key, int32_t* all) {
  pthread_mutex_lock(&c->mu);
  while (c->pending > 0 && !c->async_error && !atomic_load(&c->aborted))
    pthread_cond_wait(&c->cv, &c->mu);
  int err = c->async_error;
  pthread_mutex_unlock(&c->mu);
  if (err) return fail(err, "ncclCommSplit: the parent communicator has an error (%d)", err);
  int n = c->nranks, r = c->rank;
  all[2 * r] = color;
  all[2 * r + 1] = key;
  if (n == 1) return ncclSuccess;
  struct plan P;
  memset(&P, 0, sizeof P);
  struct coll op;
  memset(&op, 0, sizeof op);
  op.kind = K_SPLIT;
  op.comm = c;
  op.dtype = T_INT32;
  op.count = 2;
  void** recv = calloc((size_t)n, sizeof *recv);
  if (!recv) return fail(ncclSystemError, "out of memory");
  pthread_mutex_lock(&c->wire_mu);
  for (int p = 0; p < n; p++)
    if (p != r) {
      plan_send(&P, &op, p, &all[2 * r], 8);
      recv[p] = plan_recv(&P, &op, p, 8, NULL);
    }
  struct ncclComm* bad = NULL;
  int rc = P.oom ? fail(ncclSystemError, "out of memory") : run_plan(&P, &bad);
  pthread_mutex_unlock(&c->wire_mu);
  if (rc == XCHG_OK)
    for (int p = 0; p < n; p++)
      if (p != r) memcpy(&all[2 * p], recv[p], 8);
  plan_free(&P);
  free(recv);
  if (rc == XCHG_ABORTED)
    return fail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
  if (rc != XCHG_OK) set_async_error(c, rc);
  return rc;
}

static uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ull;
  }
  return h;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                  void* config) {
  (void)config;
  settings();
  if (g_version < 21800)
    return fail(ncclInvalidUsage, "ncclCommSplit needs NCCL 2.18 (this is %d)", g_version);
  ncclResult_t rc = check_comm(comm, "ncclCommSplit");
  if (rc) return rc;
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < -1) return fail(ncclInvalidArgument, "ncclCommSplit: invalid color %d", color);
  *newcomm = NULL;
  int n = comm->nranks;
  int32_t* all = calloc((size_t)n * 2, sizeof *all);
  if (!all) return fail(ncclSystemError, "out of memory");
  rc = exchange_split(comm, color, key, all);
  int split = comm->split_count++;
  if (rc != ncclSuccess || color == -1) {
    free(all);
    return rc;
  }
  /* New rank: order by (key, parent rank) among the ranks of this color. */
  int size = 0, newrank = 0;
  for (int p = 0; p < n; p++) {
    if (all[2 * p] != color) continue;
    size++;
    if (all[2 * p + 1] < key || (all[2 * p + 1] == key && p < comm->rank)) newrank++;
  }
  free(all);
  char path[160], token[80];
  snprintf(path, sizeof path, "%s/%d/%d", comm->token, split, color);
  snprintf(token, sizeof token, "%s-%016llx", comm->root_token, (unsigned long long)fnv1a(path));
  return comm_create(newcomm, size, newrank, comm->root_token, token);
}

/* Stops the comm at once: its blocked op returns, queued ops do nothing, the peers see the
 * connections close. */
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->magic != COMM_MAGIC || comm->released)
    return fail(ncclInvalidArgument, "ncclCommAbort: comm is not a live communicator");
  pthread_mutex_lock(&comm->mu);
  comm->released = 1;
  atomic_store(&comm->aborted, 1);
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
  close_wire(comm);
  comm_unref(comm);
  return ncclSuccess;
}

/* Waits for the comm's queued work (an op blocked on an error is let go), then closes. */
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->magic != COMM_MAGIC || comm->released)
    return fail(ncclInvalidArgument, "ncclCommDestroy: comm is not a live communicator");
  pthread_mutex_lock(&comm->mu);
  comm->released = 1;
  comm->closing = 1;
  pthread_cond_broadcast(&comm->cv);
  while (comm->pending > 0) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  close_wire(comm);
  comm_unref(comm);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!comm || comm->magic != COMM_MAGIC || comm->released)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm is not a live communicator");
  if (!error) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  pthread_mutex_lock(&comm->mu);
  *error = comm->async_error;
  pthread_mutex_unlock(&comm->mu);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (!comm_valid(comm) || !count) return fail(ncclInvalidArgument, "ncclCommCount: bad argument");
  *count = comm->nranks;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (!comm_valid(comm) || !rank)
    return fail(ncclInvalidArgument, "ncclCommUserRank: bad argument");
  *rank = comm->rank;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(ncclComm_t comm, int* device) {
  if (!comm_valid(comm) || !device)
    return fail(ncclInvalidArgument, "ncclCommCuDevice: bad argument");
  *device = comm->device;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpCreatePreMulSum(int* op, void* scalar, int dtype, int residence,
                                             ncclComm_t comm) {
  settings();
  if (g_version < 21100)
    return fail(ncclInvalidUsage, "ncclRedOpCreatePreMulSum needs NCCL 2.11 (this is %d)",
                g_version);
  if (!comm_valid(comm))
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: comm is not a live communicator");
  if (!op || !scalar) return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: NULL argument");
  if (dtype < 0 || dtype >= T_NUM)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid type %d", dtype);
  if (residence != 0 && residence != 1)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid residence %d", residence);
  pthread_mutex_lock(&comm->mu);
  int ix = 0;
  while (ix < comm->nops && comm->ops[ix].used) ix++;
  if (ix == comm->nops) {
    struct user_op* p = realloc(comm->ops, (size_t)(comm->nops + 1) * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&comm->mu);
      return fail(ncclSystemError, "out of memory");
    }
    comm->ops = p;
    comm->nops++;
  }
  struct user_op* u = &comm->ops[ix];
  memset(u, 0, sizeof *u);
  u->used = 1;
  u->dtype = dtype;
  u->residence = residence;
  if (residence == 1)
    memcpy(u->value, scalar, g_type_size[dtype]);
  else
    u->ptr = scalar;
  pthread_mutex_unlock(&comm->mu);
  *op = OP_FIRST_USER + ix;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpDestroy(int op, ncclComm_t comm) {
  if (!comm_valid(comm))
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: comm is not a live communicator");
  if (op < OP_FIRST_USER)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: %d is a built-in operation", op);
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&comm->mu);
  int ix = op - OP_FIRST_USER;
  if (ix >= comm->nops || !comm->ops[ix].used)
    rc = fail(ncclInvalidArgument, "ncclRedOpDestroy: operation %d unknown to this communicator",
              op);
  else
    comm->ops[ix].used = 0;
  pthread_mutex_unlock(&comm->mu);
  return rc;
}

EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, int dtype,
                                  int op, ncclComm_t comm, void* stream) {
  const char* name = "ncclAllReduce";
  struct coll c = {.kind = K_ALLREDUCE, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = -1};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc) rc = resolve_op(&c, op, name);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, int dtype,
                               int op, int root, ncclComm_t comm, void* stream) {
  const char* name = "ncclReduce";
  struct coll c = {.kind = K_REDUCE, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = root};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (root < 0 || root >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid root %d", name, root);
  if (!rc) rc = resolve_op(&c, op, name);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc && comm->rank == root) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, int dtype,
                                  int root, ncclComm_t comm, void* stream) {
  const char* name = "ncclBroadcast";
  struct coll c = {.kind = K_BROADCAST, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = root};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (root < 0 || root >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid root %d", name, root);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc && comm->rank == root) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}

#ifndef STANDIN_NCCL_OMIT_ALLGATHER
EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                  int dtype, ncclComm_t comm, void* stream) {
  const char* name = "ncclAllGather";
  struct coll c = {.kind = K_ALLGATHER, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = sendcount, .dtype = dtype, .peer = -1};
  ncclResult_t rc = common_checks(&c, name);
  size_t nb = sendcount * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb * (size_t)comm->nranks, "recvbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}
#endif

EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                      int dtype, int op, ncclComm_t comm, void* stream) {
  const char* name = "ncclReduceScatter";
  struct coll c = {.kind = K_REDUCESCATTER, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = recvbuff,
                   .count = recvcount, .dtype = dtype, .peer = -1};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc) rc = resolve_op(&c, op, name);
  size_t nb = recvcount * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb * (size_t)comm->nranks, "sendbuff", name);
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, int dtype, int peer,
                             ncclComm_t comm, void* stream) {
  const char* name = "ncclSend";
  struct coll c = {.kind = K_SEND, .comm = comm, .stream = stream,
                   .sendbuff = sendbuff, .recvbuff = NULL,
                   .count = count, .dtype = dtype, .peer = peer};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (peer < 0 || peer >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid peer %d", name, peer);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(sendbuff, nb, "sendbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}

EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, int dtype, int peer, ncclComm_t comm,
                             void* stream) {
  const char* name = "ncclRecv";
  struct coll c = {.kind = K_RECV, .comm = comm, .stream = stream,
                   .sendbuff = NULL, .recvbuff = recvbuff,
                   .count = count, .dtype = dtype, .peer = peer};
  ncclResult_t rc = common_checks(&c, name);
  if (!rc && (peer < 0 || peer >= comm->nranks))
    rc = fail(ncclInvalidArgument, "%s: invalid peer %d", name, peer);
  size_t nb = count * g_type_size[dtype < 0 || dtype >= T_NUM ? 0 : dtype];
  if (!rc) rc = check_buffer(recvbuff, nb, "recvbuff", name);
  c.red = -1;
  return rc ? call_error(rc) : issue(&c);
}
