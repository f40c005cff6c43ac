/* The stand-in NCCL's private declarations, shared by its sources (nccl_*.c).
 *
 * A stand-in for NCCL (libnccl.so.2) for machines without a GPU.
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
 * Build with -DSTANDIN_NCCL_OMIT_ALLGATHER for a library without ncclAllGather.
 *
 * The sources: nccl_settings.c (the environment, errors), nccl_comm.c (communicators),
 * nccl_mesh.c (their sockets), nccl_split.c (ncclCommSplit), nccl_collectives.c (the calls),
 * nccl_redop.c (reduction operations), nccl_groups.c (groups), nccl_launch.c (a call or group
 * on its stream), nccl_execute.c (what it does there), nccl_wire.c (messages between ranks,
 * nccl_wire.h), nccl_reduce.c (arithmetic per dtype). Built by tests/gpu_standins/build.py,
 * with -fvisibility=hidden: only EXPORT functions are the library's symbols. */
#ifndef HVDL_STANDIN_NCCL_INTERNAL_H
#define HVDL_STANDIN_NCCL_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

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

#pragma GCC visibility push(hidden)

/* Settings, diagnostics (nccl_settings.c) */

extern int g_version;
extern long g_fail_after;
/* Reads the environment, once. */
void settings(void);
/* Records the message as the thread's last error (printed with NCCL_DEBUG=WARN); returns rc. */
ncclResult_t fail(ncclResult_t rc, const char* fmt, ...);

/* Arithmetic (nccl_reduce.c) */

extern const size_t g_type_size[T_NUM];
void accumulate(void* acc, const void* x, size_t count, int dtype, int red,
                const unsigned char* scalar, int first);
void divide(void* acc, size_t count, int dtype, int n);
void avg_scalar(int dtype, int n, unsigned char* out);
int is_float(int dtype);

/* Communicators (nccl_comm.c, nccl_mesh.c) */

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

ncclResult_t comm_create(struct ncclComm** out, int nranks, int rank, const char* root_token,
                         const char* token);
/* The mesh: one connected socket per peer in c->fds. */
ncclResult_t build_mesh(struct ncclComm* c);
void comm_unref(struct ncclComm* c);
int comm_valid(struct ncclComm* c);
ncclResult_t check_comm(struct ncclComm* c, const char* name);
void set_async_error(struct ncclComm* c, ncclResult_t rc);
void block_until_released(struct ncclComm* c);

/* Operations (nccl_collectives.c, nccl_redop.c, nccl_groups.c, nccl_launch.c,
 * nccl_execute.c) */

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

ncclResult_t resolve_op(struct coll* op, int user_op, const char* name);
/* Puts op on its stream, or adds it to the thread's group. */
ncclResult_t issue(const struct coll* op);
ncclResult_t call_error(ncclResult_t rc);
int launch_add(struct launch* L, const struct coll* op);
void launch_free(struct launch* L);
ncclResult_t launch_submit(struct launch* L);
int execute(struct launch* L, struct ncclComm** bad);

#pragma GCC visibility pop

#endif
