// Copies 64 MiB out of another process with process_vm_readv (the single-copy mechanism of
// Open MPI's CMA), in chunks of CHUNK_KIB, beside a memcpy of as many bytes inside this process:
// whether an allreduce that reads its peers' buffers in place could beat one that stages them.
// Run by cross_memory_copy.py, which prints the provenance header.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const size_t n = (size_t)64 << 20;
  const size_t chunk = (size_t)(argc > 1 ? atoi(argv[1]) : 1024) << 10;
  const int rounds = argc > 2 ? atoi(argv[2]) : 5;
  volatile int* flags = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char* volatile* where = (char* volatile*)(flags + 16);
  pid_t child = fork();
  if (child == 0) {
    char* b = malloc(n);
    memset(b, 1, n);
    *where = b;
    __sync_synchronize();
    flags[0] = 1;
    while (flags[1] == 0) usleep(1000);
    return 0;
  }
  while (flags[0] == 0) usleep(1000);
  char* dst = malloc(n);
  char* src = malloc(n);
  memset(dst, 0, n);
  memset(src, 2, n);
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    for (size_t o = 0; o < n; o += chunk) {
      struct iovec local = {dst + o, chunk}, remote = {*where + o, chunk};
      if (process_vm_readv(child, &local, 1, &remote, 1, 0) != (ssize_t)chunk) {
        perror("process_vm_readv");
        return 1;
      }
    }
    double t1 = now();
    memcpy(dst, src, n);
    double t2 = now();
    if (dst[n - 1] != 2) return 1;
    printf("round %d: process_vm_readv %.2f ms (%.1f GB/s), memcpy %.2f ms (%.1f GB/s)\n", r + 1,
           (t1 - t0) * 1e3, n / (t1 - t0) / 1e9, (t2 - t1) * 1e3, n / (t2 - t1) / 1e9);
  }
  flags[1] = 1;
  wait(0);
  return 0;
}
