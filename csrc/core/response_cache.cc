#include "response_cache.h"

namespace horovodlike {

ResponseCache::Lookup ResponseCache::Find(const Request& request, int* slot) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return Lookup::kMiss;
  *slot = it->second;
  return slots_[it->second].request.SameParameters(request) ? Lookup::kHit : Lookup::kInvalid;
}

int ResponseCache::Put(const Response& response, const Request& request,
                       Request* evicted_request) {
  if (!enabled()) return -1;
  int evicted = -1;
  const std::string& name = response.names.at(0);
  int slot;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    slot = it->second;
  } else {
    slot = -1;
    for (int i = 0; i < num_slots(); ++i) {
      if (!slots_[i].occupied) { slot = i; break; }
    }
    if (slot < 0 && num_slots() < capacity_) {
      slots_.emplace_back();
      slot = num_slots() - 1;
    }
    if (slot < 0) {
      slot = 0;
      for (int i = 1; i < num_slots(); ++i) {
        if (slots_[i].last_used < slots_[slot].last_used) slot = i;
      }
      by_name_.erase(slots_[slot].response.names.at(0));
      *evicted_request = std::move(slots_[slot].request);
      evicted = slot;
    }
    by_name_[name] = slot;
  }
  Slot& s = slots_[slot];
  s.occupied = true;
  s.response = response;
  s.request = request;
  s.last_used = ++clock_;
  return evicted;
}

void ResponseCache::SetActive(bool active) {
  if (!active) {
    // The slots stay allocated, empty: the bit vectors keep their length on every rank.
    for (int slot = 0; slot < num_slots(); ++slot) Erase(slot);
  }
  active_ = active;
}

void ResponseCache::Erase(int slot) {
  Slot& s = slots_[slot];
  if (!s.occupied) return;
  by_name_.erase(s.response.names.at(0));
  s.occupied = false;
}

}  // namespace horovodlike
