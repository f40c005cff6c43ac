// The runtime parameters the autotuner may change while the job runs, and how the coordinator
// hands them to every rank inside the negotiation's bit vector.
//
// Fusion runs locally on every rank, so all ranks must fuse with the same threshold in the same
// round or they would pack different buffers. The global set's coordinator therefore writes the
// parameters into words appended to the bit vector that every round AND-reduces; the other
// ranks contribute all ones there, so the AND leaves exactly the coordinator's values, and every
// rank adopts them in the same round at no extra message.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace horovodlike {

struct TunedParameters {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  bool cache_enabled = true;
  bool tuning = false;  // the autotuner is still sampling; false once it fixed its choice

  bool operator==(const TunedParameters& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes &&
           cycle_time_ms == o.cycle_time_ms && cache_enabled == o.cache_enabled &&
           tuning == o.tuning;
  }
  bool operator!=(const TunedParameters& o) const { return !(*this == o); }

  static constexpr size_t kWords = 3;

  // The coordinator's contribution: the values themselves.
  void AppendTo(std::vector<uint64_t>& bits) const {
    uint64_t cycle_bits = 0;
    static_assert(sizeof(cycle_bits) == sizeof(cycle_time_ms), "double must be 64 bits");
    std::memcpy(&cycle_bits, &cycle_time_ms, sizeof(cycle_bits));
    bits.push_back(static_cast<uint64_t>(fusion_threshold_bytes));
    bits.push_back(cycle_bits);
    bits.push_back((cache_enabled ? 1ULL : 0ULL) | (tuning ? 2ULL : 0ULL));
  }
  // Everyone else's: the identity of AND.
  static void AppendIdentityTo(std::vector<uint64_t>& bits) {
    bits.insert(bits.end(), kWords, ~0ULL);
  }
  static TunedParameters FromWords(const uint64_t* words) {
    TunedParameters p;
    p.fusion_threshold_bytes = static_cast<int64_t>(words[0]);
    std::memcpy(&p.cycle_time_ms, &words[1], sizeof(p.cycle_time_ms));
    p.cache_enabled = (words[2] & 1) != 0;
    p.tuning = (words[2] & 2) != 0;
    return p;
  }
};

}  // namespace horovodlike
