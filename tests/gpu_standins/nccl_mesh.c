/* The stand-in NCCL's mesh: at ncclCommInitRank (and each split) the ranks connect a
 * Unix-domain stream socket to every other rank; abstract names derived from the unique id. */
#include "nccl_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_MS 30000

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

/* Rank r's listening socket, which the higher ranks connect to. */
static ncclResult_t mesh_listen(struct ncclComm* c, int* out) {
  int n = c->nranks, r = c->rank;
  struct sockaddr_un addr;
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) return fail(ncclSystemError, "socket: %s", strerror(errno));
  socklen_t len = socket_name(&addr, c->token, r);
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
  *out = lfd;
  return ncclSuccess;
}

/* Connects to the lower rank p (retrying until it listens) and introduces this rank. */
static ncclResult_t mesh_connect(struct ncclComm* c, int p, struct hello* me, long deadline) {
  int n = c->nranks, r = c->rank;
  struct sockaddr_un addr;
  socklen_t len = socket_name(&addr, c->token, p);
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(ncclSystemError, "socket: %s", strerror(errno));
    tune_socket(fd);
    if (connect(fd, (struct sockaddr*)&addr, len) == 0) {
      if (io_full(fd, me, sizeof *me, 1, deadline) != 0) {
        close(fd);
        return fail(ncclSystemError, "ncclCommInitRank: rank %d: lost rank %d while connecting",
                    r, p);
      }
      c->fds[p] = fd;
      return ncclSuccess;
    }
    int e = errno;
    close(fd);
    if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) ||
        now_ms() >= deadline) {
      return fail(ncclSystemError,
                  "ncclCommInitRank: rank %d could not reach rank %d of %d within %d s (%s)", r,
                  p, n, CONNECT_TIMEOUT_MS / 1000, strerror(e));
    }
    struct timespec ts = {0, 5 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Accepts every higher rank, each introducing itself. */
static ncclResult_t mesh_accept(struct ncclComm* c, int lfd, long deadline) {
  int n = c->nranks, r = c->rank;
  for (int accepted = 0; accepted < n - 1 - r;) {
    long left = deadline - now_ms();
    if (left <= 0) {
      return fail(ncclSystemError,
                  "ncclCommInitRank: rank %d: %d of %d ranks did not join within %d s", r,
                  n - 1 - r - accepted, n, CONNECT_TIMEOUT_MS / 1000);
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
        return fail(ncclInvalidUsage, "ncclCommInitRank: ranks disagree on nranks (%d, %d)", n,
                    (int)h.nranks);
      }
      continue;
    }
    c->fds[h.rank] = fd;
    accepted++;
  }
  return ncclSuccess;
}

/* The mesh: rank r listens, connects to every lower rank, and accepts every higher one. */
ncclResult_t build_mesh(struct ncclComm* c) {
  int n = c->nranks, r = c->rank;
  c->fds = malloc((size_t)n * sizeof *c->fds);
  c->send_seq = calloc((size_t)n, sizeof *c->send_seq);
  c->recv_seq = calloc((size_t)n, sizeof *c->recv_seq);
  if (!c->fds || !c->send_seq || !c->recv_seq) return fail(ncclSystemError, "out of memory");
  for (int p = 0; p < n; p++) c->fds[p] = -1;
  if (n == 1) return ncclSuccess;
  long deadline = now_ms() + CONNECT_TIMEOUT_MS;
  int lfd = -1;
  ncclResult_t rc = ncclSuccess;
  if (r < n - 1) {
    rc = mesh_listen(c, &lfd);
    if (rc != ncclSuccess) return rc;
  }
  struct hello me = {MSG_MAGIC, r, n, {0}};
  snprintf(me.token, sizeof me.token, "%s", c->token);
  for (int p = 0; p < r && rc == ncclSuccess; p++) rc = mesh_connect(c, p, &me, deadline);
  if (rc == ncclSuccess) rc = mesh_accept(c, lfd, deadline);
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
