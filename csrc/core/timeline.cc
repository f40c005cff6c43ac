#include "timeline.h"

#include <cerrno>
#include <cstring>

namespace horovodlike {
namespace {

// Events held before the writer is woken early; it also wakes on its own every kFlushInterval,
// so that a job killed mid-run leaves most of its trace on disk.
constexpr size_t kWakeWriterAt = 4096;
constexpr auto kFlushInterval = std::chrono::milliseconds(200);
// Storage of each of the two buffers, kept between flushes: a busy loop outgrows it only when
// the writer falls behind.
constexpr size_t kBufferEvents = 2 * kWakeWriterAt;

constexpr int kCycleRow = 0;  // tensor rows are numbered from 1
const std::string kCycleRowName = "CYCLE_START";

const char* NegotiateLabel(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "NEGOTIATE_ALLREDUCE";
    case OpType::kAllgather: return "NEGOTIATE_ALLGATHER";
    case OpType::kBroadcast: return "NEGOTIATE_BROADCAST";
    case OpType::kBarrier: return "NEGOTIATE_BARRIER";
    case OpType::kAlltoall: return "NEGOTIATE_ALLTOALL";
    case OpType::kReducescatter: return "NEGOTIATE_REDUCESCATTER";
    case OpType::kJoin: return "NEGOTIATE_JOIN";
    case OpType::kAddProcessSet: return "NEGOTIATE_ADD_PROCESS_SET";
    case OpType::kRemoveProcessSet: return "NEGOTIATE_REMOVE_PROCESS_SET";
  }
  return "NEGOTIATE";
}

const char* OperationLabel(Response::Type type) {
  switch (type) {
    case Response::Type::kAllreduce: return "ALLREDUCE";
    case Response::Type::kAllgather: return "ALLGATHER";
    case Response::Type::kBroadcast: return "BROADCAST";
    case Response::Type::kBarrier: return "BARRIER";
    case Response::Type::kAlltoall: return "ALLTOALL";
    case Response::Type::kReducescatter: return "REDUCESCATTER";
    case Response::Type::kJoin: return "JOIN";
    case Response::Type::kAddProcessSet: return "ADD_PROCESS_SET";
    case Response::Type::kRemoveProcessSet: return "REMOVE_PROCESS_SET";
    case Response::Type::kError: return "ERROR";
  }
  return "OPERATION";
}

// The lower-case operation ("allreduce") of a label ("NEGOTIATE_ALLREDUCE", "ALLREDUCE"), for
// row titles; "" for an error, whose row keeps the bare tensor name. The labels are literals,
// so the results are kept in a fixed table.
const char* RowPrefix(const char* label) {
  static const struct {
    const char* label;
    const char* prefix;
  } kPrefixes[] = {
      {"ALLREDUCE", "allreduce"},         {"ALLGATHER", "allgather"},
      {"BROADCAST", "broadcast"},         {"BARRIER", "barrier"},
      {"ALLTOALL", "alltoall"},           {"REDUCESCATTER", "reducescatter"},
      {"JOIN", "join"},                   {"ADD_PROCESS_SET", "add_process_set"},
      {"REMOVE_PROCESS_SET", "remove_process_set"},
  };
  const char* op = std::strncmp(label, "NEGOTIATE_", 10) == 0 ? label + 10 : label;
  for (const auto& entry : kPrefixes) {
    if (std::strcmp(op, entry.label) == 0) return entry.prefix;
  }
  return "";
}

// Tensor names are user text: quotes, backslashes and control characters would break the JSON.
void AppendEscaped(std::string& out, const std::string& text) {
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char code[8];
      std::snprintf(code, sizeof(code), "\\u%04x", c);
      out += code;
    } else {
      out += static_cast<char>(c);
    }
  }
}

}  // namespace

void Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> control(control_mutex_);
  if (path.empty()) throw InvalidArgument("the timeline needs a file path");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    throw InvalidArgument("cannot write the timeline to '" + path + "': " +
                          std::strerror(errno) +
                          "; give a path in an existing directory that this process can write");
  }
  // Opened before the old recording ends: a bad path leaves that one running.
  StopLocked();
  // "[" then events each preceded by ",": a trace cut off by a kill lacks only the closing
  // bracket, which the trace viewers do not require.
  std::fputs("[\n", file);
  file_ = file;
  first_event_ = true;
  writing_.clear();
  writing_.reserve(kBufferEvents);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.clear();
    pending_.reserve(kBufferEvents);
    rows_.clear();
    current_.clear();
    current_.reserve(64);
    origin_ = std::chrono::steady_clock::now();
    mark_cycles_ = mark_cycles;
    stopping_ = false;
    operation_ended_ = false;
    recording_ = true;
    if (mark_cycles) {
      Event names_cycles;
      names_cycles.phase = 'M';
      names_cycles.row = kCycleRow;
      names_cycles.name = &kCycleRowName;
      pending_.push_back(names_cycles);
    }
  }
  writer_ = std::thread([this] { WriterLoop(); });
  active_.store(true, std::memory_order_relaxed);
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_mutex_);
  StopLocked();
}

void Timeline::StopLocked() {
  if (!writer_.joinable()) return;
  active_.store(false, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Phases cut short by the stop end now, so that every begin has its end.
    const int64_t now = Now();
    for (auto& [name, row] : rows_) {
      while (row.open > 0) End(row, now);
    }
    recording_ = false;
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  rows_.clear();
  current_.clear();
}

int64_t Timeline::Now() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               origin_)
      .count();
}

void Timeline::Wake() {
  if (pending_.size() == kWakeWriterAt) wake_.notify_one();
}

Timeline::Row& Timeline::RowOf(const std::string& name, const char* op) {
  auto it = rows_.find(name);
  if (it != rows_.end()) return it->second;
  it = rows_.emplace(name, Row{}).first;
  it->second.id = static_cast<int>(rows_.size());
  // Horovod's rows read "allreduce.grad.w" (its torch layer names tensors so, and its tests
  // look for that); names that already start with the operation (unnamed collectives'
  // "allreduce.noname.3") keep it once.
  const std::string prefix = std::string(op) + ".";
  it->second.title = (op[0] == '\0' || name.compare(0, prefix.size(), prefix) == 0)
                         ? name
                         : prefix + name;
  Event names_row;
  names_row.phase = 'M';
  names_row.row = it->second.id;
  names_row.name = &it->second.title;
  pending_.push_back(names_row);
  return it->second;
}

void Timeline::Begin(Row& row, const char* label, int64_t micros) {
  Event event;
  event.micros = micros;
  event.row = row.id;
  event.phase = 'B';
  event.label = label;
  pending_.push_back(event);
  ++row.open;
  Wake();
}

void Timeline::End(Row& row, int64_t micros) {
  if (row.open == 0) return;  // began before this recording started
  Event event;
  event.micros = micros;
  event.row = row.id;
  event.phase = 'E';
  pending_.push_back(event);
  --row.open;
  Wake();
}

void Timeline::RecordNegotiateStart(const std::string& name, OpType op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return;
  Row& row = RowOf(name, RowPrefix(NegotiateLabel(op)));
  if (row.negotiating) return;
  row.negotiating = true;
  Begin(row, NegotiateLabel(op), Now());
}

void Timeline::RecordNegotiateEnd(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return;
  auto it = rows_.find(name);
  if (it == rows_.end() || !it->second.negotiating) return;
  it->second.negotiating = false;
  End(it->second, Now());
}

void Timeline::RecordOperationStart(const Response* const* parts, size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return;
  const int64_t now = Now();
  current_.clear();
  const char* label = OperationLabel(parts[0]->type);
  for (size_t i = 0; i < count; ++i) {
    Row& row = RowOf(parts[i]->names.at(0), RowPrefix(label));
    // Normally ended when the round released it; a recording started in between has none.
    if (row.negotiating) {
      row.negotiating = false;
      End(row, now);
    }
    // Whatever an interrupted collective left open (it threw) ends before this one begins.
    while (row.open > 0) End(row, now);
    Begin(row, label, now);
    current_.push_back(&row);
  }
}

void Timeline::RecordOperationEnd() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recording_) return;
    const int64_t now = Now();
    for (Row* row : current_) {
      while (row->open > 0) End(*row, now);
    }
    current_.clear();
    operation_ended_ = true;
  }
  // Horovod's users (and its tests) read the file a moment after a collective returns: the
  // writer writes each finished operation at once instead of at its next interval. Waking it
  // costs the loop one notify per collective, and only while recording.
  wake_.notify_one();
}

void Timeline::RecordActivity(const char* label) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return;
  const int64_t now = Now();
  for (Row* row : current_) {
    if (label != nullptr) {
      Begin(*row, label, now);
    } else if (row->open > 1) {  // never the operation itself: OperationEnd ends that
      End(*row, now);
    }
  }
}

void Timeline::RecordCycleStart() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_ || !mark_cycles_) return;
  Event event;
  event.micros = Now();
  event.row = kCycleRow;
  event.phase = 'i';
  event.label = "CYCLE_START";
  pending_.push_back(event);
  Wake();
}

void Timeline::WriterLoop() {
  while (true) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, kFlushInterval, [this] {
        return stopping_ || operation_ended_ || pending_.size() >= kWakeWriterAt;
      });
      operation_ended_ = false;
      // The background thread goes on with the other buffer (its storage kept) at once.
      pending_.swap(writing_);
      stopping = stopping_;
    }
    for (const Event& event : writing_) Write(event);
    writing_.clear();
    std::fflush(file_);
    if (stopping) break;
  }
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

void Timeline::Write(const Event& event) {
  line_.clear();
  line_ += first_event_ ? "" : ",\n";
  first_event_ = false;
  const std::string pid = std::to_string(event.row);
  switch (event.phase) {
    case 'M':
      line_ += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid +
               ", \"args\": {\"name\": \"";
      AppendEscaped(line_, *event.name);
      line_ += "\"}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + pid +
               ", \"args\": {\"sort_index\": " + pid + "}}";
      break;
    case 'B':
      line_ += "{\"ph\": \"B\", \"name\": \"" + std::string(event.label) +
               "\", \"ts\": " + std::to_string(event.micros) + ", \"pid\": " + pid +
               ", \"tid\": 0}";
      break;
    case 'E':
      line_ += "{\"ph\": \"E\", \"ts\": " + std::to_string(event.micros) + ", \"pid\": " + pid +
               ", \"tid\": 0}";
      break;
    case 'i':
      // Global scope: drawn as a line across every row.
      line_ += "{\"ph\": \"i\", \"name\": \"" + std::string(event.label) +
               "\", \"ts\": " + std::to_string(event.micros) + ", \"pid\": " + pid +
               ", \"tid\": 0, \"s\": \"g\"}";
      break;
  }
  std::fwrite(line_.data(), 1, line_.size(), file_);
}

}  // namespace horovodlike
