/* The stand-in NCCL's wire: the messages an operation plans (a header each side checks,
 * then the data), moved over the comms' sockets all at once, without blocking on any peer. */
#include "nccl_wire.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#define POLL_MS 100

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

void* plan_tmp(struct plan* P, size_t n) {
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

void plan_send(struct plan* P, const struct coll* op, int peer, const void* data,
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

void* plan_recv(struct plan* P, const struct coll* op, int peer, uint64_t bytes,
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

void plan_free(struct plan* P) {
  for (int i = 0; i < P->nch; i++) {
    free(P->ch[i].sends);
    free(P->ch[i].recvs);
  }
  free(P->ch);
  for (int i = 0; i < P->ntmp; i++) free(P->tmp[i]);
  free(P->tmp);
}

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
int run_plan(struct plan* P, struct ncclComm** bad) {
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
