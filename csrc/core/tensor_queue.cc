#include "tensor_queue.h"

#include <charconv>

namespace horovodlike {

std::string QueueKey(int process_set_id, const std::string& name) {
  std::string key;
  QueueKey(process_set_id, name, &key);
  return key;
}

void QueueKey(int process_set_id, const std::string& name, std::string* key) {
  char id[16];
  char* end = std::to_chars(id, id + sizeof(id) - 1, process_set_id).ptr;
  *end++ = ':';
  key->assign(id, end);
  key->append(name);
}

void TensorQueue::Add(TensorEntry entry, bool wake) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entry.key = QueueKey(entry.process_set_id, entry.request.name);
    if (entries_.count(entry.key) != 0) {
      throw InvalidArgument("a collective on a tensor named '" + entry.request.name +
                            "' is already in flight; wait for it or give each concurrent "
                            "operation a unique name");
    }
    new_requests_.emplace_back(entry.process_set_id, entry.request);
    entries_.emplace(entry.key, std::move(entry));
  }
  if (wake) cv_.notify_one();
}

void TensorQueue::PopNewRequests(std::vector<std::pair<int, Request>>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mutex_);
  out->swap(new_requests_);
}

TensorQueue::Wake TensorQueue::WaitForWork(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !new_requests_.empty() || notified_ || rung_; });
  const Wake wake = notified_                ? Wake::kNotified
                    : !new_requests_.empty() ? Wake::kNewRequests
                    : rung_                  ? Wake::kBell
                                             : Wake::kTimeout;
  notified_ = false;
  rung_ = false;
  return wake;
}

void TensorQueue::Ring() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rung_ = true;
  }
  cv_.notify_one();
}

void TensorQueue::Notify() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    notified_ = true;
  }
  cv_.notify_one();
}

bool TensorQueue::HasNewRequests() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !new_requests_.empty();
}

const void* TensorQueue::HostInput(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  const TensorEntry& entry = it->second;
  return entry.output != nullptr && entry.request.device < 0 ? entry.input : nullptr;
}

bool TensorQueue::Take(const std::string& name, TensorEntry* entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return false;
  *entry = std::move(it->second);
  entries_.erase(it);
  return true;
}

std::vector<TensorEntry> TensorQueue::TakeAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TensorEntry> out;
  for (auto& kv : entries_) out.push_back(std::move(kv.second));
  entries_.clear();
  new_requests_.clear();
  return out;
}

std::vector<TensorEntry> TensorQueue::TakeProcessSet(int process_set_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TensorEntry> out;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.process_set_id == process_set_id) {
      out.push_back(std::move(it->second));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace horovodlike
