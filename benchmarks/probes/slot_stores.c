// Two processes on CPUs 0 and 1 stream 64 MiB to each other at once through two 1 MiB slots
// each (as the shared-memory allreduce stages its chunks), the writer of a slot copying into it
// with memcpy (ordinary stores) or with streaming (non-temporal) stores, the reader copying out
// with memcpy; before each round, a cache line's round trip between the two CPUs. Prints one
// line per round: whether the way of storing matters with the CPUs' placement (a virtual
// machine's CPUs may share a cache or not, and move). Run by slot_stores.py.
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE 64
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); sched_setaffinity(0, sizeof(s), &s); }
static void nt_copy(void* d, const void* s, size_t n) {
  float* dst = d; const float* src = s;
  for (size_t i = 0; i < n / 4; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  _mm_sfence();
}
typedef struct { volatile uint64_t v; char pad[LINE - 8]; } Line;
int main(int argc, char** argv) {
  const size_t n = (size_t)64 << 20;
  const size_t chunk = (size_t)(argc > 1 ? atoi(argv[1]) : 1024) << 10;
  const int iters = argc > 2 ? atoi(argv[2]) : 30;
  size_t shared = 16 * LINE + 4 * chunk;
  char* sh = mmap(0, shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(sh, 0, shared);
  Line* ctl = (Line*)sh;  // 0: ping, 1: pong, 2: staged[0], 3: released[0], 4: staged[1], 5: released[1], 6: go
  char* slots = sh + 16 * LINE;  // slots[who][parity]
  pid_t child = fork();
  int me = child == 0 ? 1 : 0;
  pin(me);
  char* src = aligned_alloc(64, n); char* dst = aligned_alloc(64, n);
  memset(src, me + 1, n); memset(dst, 0, n);
  uint64_t step = 0;
  for (int it = 0; it < iters; ++it) {
    // round trip
    double rt = 0;
    {
      const int k = 2000;
      // barrier via go counter
      __atomic_add_fetch(&ctl[6].v, 1, __ATOMIC_SEQ_CST);
      while (ctl[6].v < (uint64_t)(2 * (3 * it + 1))) ;
      double t0 = now();
      for (int i = 0; i < k; ++i) {
        if (me == 0) { ctl[0].v = i + 1 + (uint64_t)it * k; while (ctl[1].v != i + 1 + (uint64_t)it * k) ; }
        else { while (ctl[0].v != i + 1 + (uint64_t)it * k) ; ctl[1].v = i + 1 + (uint64_t)it * k; }
      }
      rt = (now() - t0) / k * 1e9;
    }
    double ms[2];
    for (int method = 0; method < 2; ++method) {
      __atomic_add_fetch(&ctl[6].v, 1, __ATOMIC_SEQ_CST);
      while (ctl[6].v < (uint64_t)(2 * (3 * it + 2 + method))) ;
      double t0 = now();
      size_t chunks = n / chunk;
      int peer = 1 - me;
      for (size_t c = 0; c < chunks; ++c) {
        ++step;
        char* myslot = slots + ((size_t)me * 2 + (step & 1)) * chunk;
        char* theirslot = slots + ((size_t)peer * 2 + (step & 1)) * chunk;
        {  // write this process's slot
          if (step > 2) while (ctl[3 + 2 * peer].v < step - 2) ;
          if (method) nt_copy(myslot, src + c * chunk, chunk); else memcpy(myslot, src + c * chunk, chunk);
          __atomic_store_n(&ctl[2 + 2 * me].v, step, __ATOMIC_RELEASE);
        }
        {  // read the peer's
          while (__atomic_load_n(&ctl[2 + 2 * peer].v, __ATOMIC_ACQUIRE) < step) ;
          memcpy(dst + c * chunk, theirslot, chunk);
          __atomic_store_n(&ctl[3 + 2 * me].v, step, __ATOMIC_RELEASE);
        }
      }
      // wait for the peer to finish
      while (ctl[3 + 2 * peer].v < step) ;
      ms[method] = (now() - t0) * 1e3;
    }
    if (me == 0) { printf("rt %6.0f ns  ordinary %7.2f ms  streaming %7.2f ms\n", rt, ms[0], ms[1]); fflush(stdout); }
  }
  if (child) wait(NULL);
  return 0;
}
