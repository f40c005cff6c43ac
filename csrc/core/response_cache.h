// Responses of tensors seen before, in numbered slots. Every rank performs the same sequence of
// Put/Touch/Erase (the responses it executes, in the same order), so slot numbers agree across
// ranks and a bit per slot is enough to say "this tensor is ready here".
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace horovodlike {

class ResponseCache {
 public:
  enum class Lookup { kMiss, kHit, kInvalid };

  explicit ResponseCache(int capacity) : capacity_(capacity) {}
  bool enabled() const { return capacity_ > 0 && active_; }
  // Switches the cache off (emptying it) or back on; every rank does so in the same round.
  void SetActive(bool active);
  // kHit: same name, same parameters; kInvalid: same name, different parameters.
  Lookup Find(const Request& request, int* slot) const;
  // Inserts or refreshes the response of a single executed tensor; evicts the least recently
  // used slot when full; then returns that slot and moves its request to `evicted`, else
  // returns -1.
  int Put(const Response& response, const Request& request, Request* evicted);
  // Marks an occupied slot the most recently used.
  void Touch(int slot) { slots_[slot].last_used = ++clock_; }
  void Erase(int slot);
  const Response& response(int slot) const { return slots_[slot].response; }
  const Request& request(int slot) const { return slots_[slot].request; }
  bool occupied(int slot) const { return slots_[slot].occupied; }
  // Slots handed out so far: the length of the bit vectors.
  int num_slots() const { return static_cast<int>(slots_.size()); }

 private:
  struct Slot {
    bool occupied = false;
    Response response;
    Request request;
    uint64_t last_used = 0;
  };
  int capacity_;
  bool active_ = true;
  uint64_t clock_ = 0;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> by_name_;
};

}  // namespace horovodlike
