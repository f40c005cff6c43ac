#include "shm_os.h"

#include "shm_bell.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace horovodlike {
namespace shm {

bool ReadProcessStat(int pid, char* state, uint64_t* start_time) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  // open/read rather than stdio or streams: a waiting rank checks its peers this way every
  // few milliseconds, and that must not allocate.
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[1024];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const char* p = std::strrchr(text, ')');
  if (p == nullptr) return false;
  // Field 3 is the state; field 22 the start time in clock ticks since boot.
  for (int i = 3; i <= 22; ++i) {
    while (*p == ' ' || *p == ')') ++p;
    if (*p == '\0') return false;
    if (i == 3) *state = *p;
    if (i == 22) {
      *start_time = std::strtoull(p, nullptr, 10);
      return true;
    }
    while (*p != ' ' && *p != '\0') ++p;
  }
  return false;
}

bool ProcessAlive(int pid, uint64_t start_time) {
  char state = '?';
  uint64_t now_start = 0;
  if (!ReadProcessStat(pid, &state, &now_start)) return false;
  return now_start == start_time && state != 'Z' && state != 'X' && state != 'x';
}

long FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts,
                   nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

int ThreadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

void RecordThisProcess(RankControl* control) {
  char state;
  uint64_t start_time = 0;
  ReadProcessStat(::getpid(), &state, &start_time);
  control->pid = ::getpid();
  control->start_time = start_time;
  control->bell_token = PollBellToken();
  control->cpu.store(-1, std::memory_order_relaxed);
  cpu_set_t set;
  CPU_ZERO(&set);
  // The process's mask (its main thread's), not this thread's: the runtime's own threads may
  // be pinned (HOROVOD_THREAD_AFFINITY) while the training runs anywhere.
  const bool known = sched_getaffinity(::getpid(), sizeof(set), &set) == 0;
  for (size_t c = 0; c < kCpuWords * 64; ++c) {
    if (!known || (c < CPU_SETSIZE && CPU_ISSET(c, &set))) {
      control->cpus_allowed[c / 64] |= uint64_t{1} << (c % 64);
    }
  }
}

}  // namespace shm
}  // namespace horovodlike
