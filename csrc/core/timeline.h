// The Horovod timeline: a Chrome trace (chrome://tracing, Perfetto) of what the background
// thread did with each tensor. One row per tensor name; on it NEGOTIATE_<OP> (from the round
// in which this rank first saw the tensor to the round that released it on every rank), then
// the operation (ALLREDUCE, ALLGATHER...) with its activities nested inside
// (MEMCPY_IN_FUSION_BUFFER, RING_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER...). Optional
// CYCLE_START markers on a row of their own show the rounds of the loop.
//
// The background thread records events into a buffer whose storage is kept between flushes;
// a writer thread of its own swaps that buffer out and writes it, so the loop never waits on
// the file. When no timeline is recording, every hook costs one relaxed load and a branch,
// and allocates nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "message.h"

namespace horovodlike {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline() { Stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts recording into `path` (created or truncated), ending a recording in progress first.
  // Throws InvalidArgument naming the path when it cannot be written. Any thread.
  void Start(const std::string& path, bool mark_cycles);
  // Closes the rows still open, writes the final bracket and closes the file; the file is
  // valid JSON afterwards. Does nothing when not recording. Any thread.
  void Stop();

  bool active() const { return active_.load(std::memory_order_relaxed); }

  // Hooks, background thread only. Each does nothing unless recording.
  void NegotiateStart(const std::string& name, OpType op) {
    if (active()) RecordNegotiateStart(name, op);
  }
  void NegotiateEnd(const std::string& name) {
    if (active()) RecordNegotiateEnd(name);
  }
  // The operation of one collective over the tensors of `parts` (fused ones together); the
  // activities that follow apply to all of its rows until OperationEnd.
  void OperationStart(const Response* const* parts, size_t count) {
    if (active()) RecordOperationStart(parts, count);
  }
  void OperationEnd() {
    if (active()) RecordOperationEnd();
  }
  // `label` must outlive the recording (a string literal).
  void ActivityStart(const char* label) {
    if (active()) RecordActivity(label);
  }
  void ActivityEnd() {
    if (active()) RecordActivity(nullptr);
  }
  void MarkCycleStart() {
    if (active()) RecordCycleStart();
  }

 private:
  struct Row {
    int id = 0;
    int open = 0;  // begin events not yet ended: the row's stack of phases
    bool negotiating = false;
    std::string title;  // what the trace calls the row: "<op>.<tensor name>", as Horovod does
  };
  // One trace event. 'M': the row's name (from `name`); 'B'/'E': a phase begins or ends;
  // 'i': a cycle marker.
  struct Event {
    int64_t micros = 0;
    int row = 0;
    char phase = 'B';
    const char* label = nullptr;
    const std::string* name = nullptr;  // a row's title in rows_, stable until Stop
  };

  void StopLocked();  // the caller holds control_mutex_
  void RecordNegotiateStart(const std::string& name, OpType op);
  void RecordNegotiateEnd(const std::string& name);
  void RecordOperationStart(const Response* const* parts, size_t count);
  void RecordOperationEnd();
  void RecordActivity(const char* label);  // null: end the innermost activity
  void RecordCycleStart();
  // Helpers for the Record* functions; the caller holds mutex_ and has checked recording_.
  // `op`: the operation's name in lower case, which titles a row that does not exist yet.
  Row& RowOf(const std::string& name, const char* op);
  void Begin(Row& row, const char* label, int64_t micros);
  void End(Row& row, int64_t micros);
  int64_t Now() const;
  void Wake();
  void WriterLoop();
  void Write(const Event& event);

  std::atomic<bool> active_{false};
  std::mutex control_mutex_;  // serializes Start and Stop

  // Shared by the background thread and the writer, under mutex_.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool recording_ = false;
  bool stopping_ = false;
  bool mark_cycles_ = false;
  bool operation_ended_ = false;  // wakes the writer: a finished collective reaches the file soon
  std::vector<Event> pending_;
  // Rows by tensor name. Nodes of an unordered_map keep their address on rehash, so events
  // may point at the keys while the writer formats them outside the lock.
  std::unordered_map<std::string, Row> rows_;
  std::vector<Row*> current_;  // rows of the collective being executed
  std::chrono::steady_clock::time_point origin_;

  // The writer's own.
  std::vector<Event> writing_;
  std::FILE* file_ = nullptr;
  std::string line_;
  bool first_event_ = true;
  std::thread writer_;
};

}  // namespace horovodlike
