// A probe of the machine for the benchmarks: how long a cache line takes to go from one CPU to
// another and back. On a virtual machine the host may move the guest's CPUs between its own
// cores, dies or sockets while a job runs; the probe, taken between jobs, tells the phases
// apart (a few tens of nanoseconds on one die, several times that across).
#include "testing.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace horovodlike {
namespace {

using Clock = std::chrono::steady_clock;

bool PinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

struct alignas(64) Line {
  std::atomic<int64_t> value{0};
};

}  // namespace

double CoreToCoreRoundTripNs(int cpu_a, int cpu_b, int round_trips, int batches) {
  Line line;
  std::atomic<bool> stop{false};
  std::atomic<bool> pinned{true};
  // The answering side: turns each odd value into the next even one.
  std::thread other([&] {
    if (!PinThisThread(cpu_b)) pinned = false;
    int64_t seen = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const int64_t v = line.value.load(std::memory_order_acquire);
      if (v != seen && (v & 1)) {
        line.value.store(v + 1, std::memory_order_release);
        seen = v + 1;
      }
    }
  });
  cpu_set_t before;
  sched_getaffinity(0, sizeof(before), &before);
  if (!PinThisThread(cpu_a)) pinned = false;
  std::vector<double> per_batch;
  int64_t v = 0;
  const auto give_up = Clock::now() + std::chrono::seconds(2);
  bool timed_out = false;
  for (int b = 0; b < batches && pinned && !timed_out; ++b) {
    const auto start = Clock::now();
    for (int i = 0; i < round_trips && !timed_out; ++i) {
      line.value.store(++v, std::memory_order_release);  // odd: a ping
      ++v;
      for (int spins = 1; line.value.load(std::memory_order_acquire) != v; ++spins) {
        if (spins % 4096 == 0 && Clock::now() > give_up) {
          timed_out = true;
          break;
        }
      }
    }
    per_batch.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                        round_trips);
  }
  stop = true;
  other.join();
  pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
  if (!pinned || timed_out || per_batch.empty()) return -1;
  std::sort(per_batch.begin(), per_batch.end());
  return per_batch[per_batch.size() / 2];
}

}  // namespace horovodlike
