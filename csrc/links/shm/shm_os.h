// What the shared-memory link asks of the operating system: whether a peer's process still
// lives (/proc), futex sleeps and wake-ups on words of the segment, and the CPUs a thread or
// a process may run on.
#pragma once

#include <atomic>
#include <cstdint>

#include "shm_layout.h"

namespace horovodlike {
namespace shm {

// State and start time of a process from /proc/<pid>/stat; false when there is no such process.
bool ReadProcessStat(int pid, char* state, uint64_t* start_time);
// Whether process `pid` runs and is the one that started at `start_time` (not a reused pid).
bool ProcessAlive(int pid, uint64_t start_time);
// Sleeps while *word == expected, for at most timeout_ms; the futex syscall's result.
long FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void FutexWakeAll(std::atomic<uint32_t>* word);
// This thread's CPUs (its affinity mask), at most CPU_SETSIZE.
int ThreadCpus();
// This process's pid and start time, which peers check it by, and the CPUs it may run on, into
// its control block.
void RecordThisProcess(RankControl* control);

}  // namespace shm
}  // namespace horovodlike
