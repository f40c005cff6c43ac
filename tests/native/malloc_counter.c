/* Counts heap allocations per thread, for tests that check a thread allocates nothing.
 *
 * Preloaded (LD_PRELOAD) into a job's processes: malloc, calloc, realloc, aligned_alloc,
 * posix_memalign and memalign bump a counter of the calling thread, then go to glibc's own
 * implementation. malloc_counter_of(tid) reads the counter of a thread of this process. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

/* Thread ids are below 2^22 on Linux; a collision of two live threads modulo this size would
 * only merge their counts. */
#define SLOTS 65536
static _Atomic long counts[SLOTS];

static void count(void) {
  atomic_fetch_add_explicit(&counts[syscall(SYS_gettid) % SLOTS], 1, memory_order_relaxed);
}

void* malloc(size_t n) { count(); return __libc_malloc(n); }
void* calloc(size_t n, size_t size) { count(); return __libc_calloc(n, size); }
void* realloc(void* p, size_t n) { count(); return __libc_realloc(p, n); }
void free(void* p) { __libc_free(p); }
void* memalign(size_t alignment, size_t n) { count(); return __libc_memalign(alignment, n); }
void* aligned_alloc(size_t alignment, size_t n) { count(); return __libc_memalign(alignment, n); }
int posix_memalign(void** out, size_t alignment, size_t n) {
  count();
  void* p = __libc_memalign(alignment, n);
  if (p == NULL && n != 0) return 12; /* ENOMEM */
  *out = p;
  return 0;
}

long malloc_counter_of(int tid) {
  return atomic_load_explicit(&counts[tid % SLOTS], memory_order_relaxed);
}
