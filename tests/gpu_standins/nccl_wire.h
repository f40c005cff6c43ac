/* The stand-in NCCL's wire (nccl_wire.c): an operation's messages are planned per channel
 * (one comm, one peer), then all of them move at once. Private to the library. */
#ifndef HVDL_STANDIN_NCCL_WIRE_H
#define HVDL_STANDIN_NCCL_WIRE_H

#include "nccl_internal.h"

#pragma GCC visibility push(hidden)

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

enum { XCHG_OK = 0, XCHG_ABORTED = -1 };

/* Queues a message of bytes from data to peer. */
void plan_send(struct plan* P, const struct coll* op, int peer, const void* data,
               uint64_t bytes);
/* Queues a message from peer; returns the buffer it will arrive in. scalar: where the
 * sender's factor goes, or NULL. */
void* plan_recv(struct plan* P, const struct coll* op, int peer, uint64_t bytes,
                unsigned char* scalar);
/* A buffer freed with the plan. */
void* plan_tmp(struct plan* P, size_t n);
void plan_free(struct plan* P);
/* Moves every planned message, all channels at once (no ordering between peers, so no
 * deadlock). Returns XCHG_OK, XCHG_ABORTED, or an NCCL error with *bad = the comm it concerns. The
 * caller holds the wires of all the plan's comms. */
int run_plan(struct plan* P, struct ncclComm** bad);

#pragma GCC visibility pop

#endif
