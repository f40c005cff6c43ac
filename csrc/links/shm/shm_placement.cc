// Where a shared-memory spinner runs (shm_link.h): the CPU each rank's spinner last ran on,
// giving way to a peer that waits on the same CPU, moving off it when they keep meeting there,
// and whether more threads are runnable than the host's ranks have cores.
#include "shm_link.h"

#include "shm_os.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "../../common/logging.h"

namespace horovodlike {
namespace {

using Clock = std::chrono::steady_clock;

// A spinner that finds the peer it waits for on its own CPU this many times, each within
// kSharedCpuForgetNs of the last, moves to another CPU (MoveToFreeCpu).
constexpr int kSharedCpuMeetingsBeforeMove = 8;
constexpr int64_t kSharedCpuForgetNs = 20 * 1000 * 1000;

}  // namespace

bool ShmLink::SharesCpuWith(int peer) {
  const int cpu = sched_getcpu();
  if (cpu < 0) return false;
  std::atomic<int32_t>& mine = control(index_).cpu;
  if (mine.load(std::memory_order_relaxed) != cpu) mine.store(cpu, std::memory_order_relaxed);
  if (peer == index_ || control(peer).cpu.load(std::memory_order_relaxed) != cpu) return false;
  // The peer this waits for last spun on this CPU and has not moved on since: most likely it
  // now waits for this very CPU. If the two keep meeting there (the scheduler rarely parts two
  // threads that keep the CPU busy in turns, and two spinners on one core are several times
  // slower than two sleepers), move this thread to a CPU no rank of the host spins on, within
  // its own affinity mask, which is left as it was. Sleepers are left where they are: the
  // scheduler places a woken thread beside its waker on purpose, and would undo a move at the
  // next wake-up.
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
      Clock::now().time_since_epoch()).count();
  const int64_t last = last_shared_cpu_ns_.exchange(now_ns, std::memory_order_relaxed);
  if (now_ns - last > kSharedCpuForgetNs) {
    shared_cpu_meetings_.store(1, std::memory_order_relaxed);
  } else if (shared_cpu_meetings_.fetch_add(1, std::memory_order_relaxed) + 1 >=
             kSharedCpuMeetingsBeforeMove) {
    shared_cpu_meetings_.store(0, std::memory_order_relaxed);
    MoveToFreeCpu(cpu);
  }
  return true;
}

void ShmLink::GiveWay(int peer) {
  // A thread pinned to one core shares it with this rank's other threads (the loop, the
  // training's own): it lets them run between looks rather than after a whole time slice.
  thread_local const int thread_cpus = shm::ThreadCpus();
  if (SharesCpuWith(peer) || thread_cpus == 1) sched_yield();
}

void ShmLink::MoveToFreeCpu(int cpu) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  auto taken = [&](int c) {
    for (int r = 0; r < size(); ++r) {
      if (control(r).cpu.load(std::memory_order_relaxed) == c) return true;
    }
    return false;
  };
  for (int i = 1; i < CPU_SETSIZE; ++i) {
    const int c = (cpu + i) % CPU_SETSIZE;
    if (!CPU_ISSET(c, &allowed) || taken(c)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    // Restricting the mask moves the thread at once; restoring it keeps it where it now is.
    if (sched_setaffinity(0, sizeof(one), &one) == 0) {
      sched_setaffinity(0, sizeof(allowed), &allowed);
      control(index_).cpu.store(c, std::memory_order_relaxed);
      ++moves_;
      HVDL_LOG(kDebug, "shm: rank " << members_[index_] << " kept meeting a peer on CPU " << cpu
                       << "; moved its waiting thread to CPU " << c);
    }
    return;
  }
}

bool ShmLink::CpusOversubscribed() const {
  if (loadavg_fd_ < 0) return false;
  // 1.3 us a read here, about a quarter of a small allreduce; the runnable count is a sample of
  // one moment anyway, so one a quarter millisecond old serves as well.
  constexpr int64_t kLoadRefreshNs = 250 * 1000;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
      Clock::now().time_since_epoch()).count();
  int64_t read_at = load_read_ns_.load(std::memory_order_relaxed);
  if (now - read_at < kLoadRefreshNs ||
      !load_read_ns_.compare_exchange_strong(read_at, now, std::memory_order_relaxed)) {
    return oversubscribed_.load(std::memory_order_relaxed);
  }
  char text[128];
  const ssize_t n = ::pread(loadavg_fd_, text, sizeof(text) - 1, 0);
  if (n <= 0) return false;
  text[n] = '\0';
  // "0.52 0.58 0.59 3/467 12345": the fourth field is runnable threads / all threads, now.
  const char* p = text;
  for (int spaces = 0; *p != '\0' && spaces < 3; ++p) spaces += *p == ' ';
  const bool oversubscribed = std::strtol(p, nullptr, 10) > cpus_;
  oversubscribed_.store(oversubscribed, std::memory_order_relaxed);
  return oversubscribed;
}

}  // namespace horovodlike
