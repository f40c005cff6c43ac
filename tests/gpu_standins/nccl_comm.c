/* The stand-in NCCL's communicators: made from a unique id (ncclCommInitRank) or a split,
 * their state, errors and references, and how they end (abort, destroy). */
#include "nccl_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint64_t g_comm_ids = 0;

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

void comm_unref(struct ncclComm* c) {
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (last) comm_free(c);
}

int comm_valid(struct ncclComm* c) {
  return c && c->magic == COMM_MAGIC && !c->released;
}

void set_async_error(struct ncclComm* c, ncclResult_t rc) {
  pthread_mutex_lock(&c->mu);
  if (c->async_error == ncclSuccess) c->async_error = rc;
  pthread_mutex_unlock(&c->mu);
}

/* What a stream op does after a failure: stays there, as a hung kernel, until the comm is
 * aborted or destroyed. */
void block_until_released(struct ncclComm* c) {
  pthread_mutex_lock(&c->mu);
  while (!atomic_load(&c->aborted) && !c->closing) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

ncclResult_t comm_create(struct ncclComm** out, int nranks, int rank, const char* root_token,
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

ncclResult_t check_comm(struct ncclComm* c, const char* name) {
  if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", name);
  if (c->magic != COMM_MAGIC || c->released)
    return fail(ncclInvalidArgument, "%s: comm is not a live communicator", name);
  pthread_mutex_lock(&c->mu);
  int err = c->async_error;
  pthread_mutex_unlock(&c->mu);
  if (err) return fail(err, "%s: the communicator has an error (%d); abort it", name, err);
  return ncclSuccess;
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
