// Negotiation: agrees with the other ranks of a set on which tensors are ready everywhere, so
// that every rank executes the same responses in the same order.
//
// Each round, every rank contributes one bit vector (AND-reduced): a bit per response-cache
// slot it has ready, a bit per slot it found stale, and flags (uncached work, shutdown). Cached
// tensors ready on all ranks run without any other message. Only when some rank has uncached
// work do the ranks send their requests to the coordinator (rank 0 of the set), which checks
// that all ranks asked for the same thing and answers with the responses to run.
//
// The global set's rounds also carry the tuned parameters (fusion threshold, cycle time,
// response cache) from its coordinator to every rank, so that all switch in the same round.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/env_config.h"
#include "message.h"
#include "response_cache.h"
#include "stall_inspector.h"
#include "tuned_parameters.h"
#include "../links/link.h"

namespace horovodlike {

class Controller {
 public:
  // `carries_parameters`: this is the global set, whose coordinator decides the parameters.
  Controller(Link& link, const Config& config, bool carries_parameters = false);

  // What to run this round, identical on every rank. Each part is the response of one
  // tensor; parts fused into one collective are adjacent: collective g is parts[ends[g - 1]]
  // up to parts[ends[g]] (from 0 for g = 0). The parts point into the response cache and into
  // this controller, and stay valid until the next Negotiate.
  struct Round {
    std::vector<const Response*> parts;
    std::vector<size_t> ends;
    bool shutdown = false;            // some rank asked to shut down
    std::vector<int> shutdown_ranks;  // which ones (ranks of this set)
    // The most parts a round of cached tensors can hold (one per cache slot): callers size
    // their own per-round storage to it. Grows only in rounds that negotiate new tensors.
    size_t max_parts = 0;
    // The most bytes a fusion of cached allreduces can pack (under the fusion threshold), for
    // the fusion buffer; changes only when the cache or the threshold does.
    size_t max_fused_bytes = 0;
    // Nonzero when the round is one allreduce that every rank staged early with this token
    // (StageEarly): the executor's RunStaged skips the staging. The same on every rank.
    uint64_t staged = 0;
  };
  // Consumes `new_requests` (left empty, with room for a request per cached tensor, so that
  // the caller's next rounds of tensors seen before do not grow it). Throws TransportError
  // when a peer fails, and (cause kStall) on every rank of the set when a stalled tensor
  // passes HOROVOD_STALL_SHUTDOWN_TIME_SECONDS.
  //
  // A round made only of tensors seen before allocates nothing, however many of them it
  // happens to carry: the bit vectors, the list of parts and the cache keep their storage from
  // round to round, sized for every cached tensor when the cache grows (ReserveRoundStorage).
  const Round& Negotiate(std::vector<Request>& new_requests, bool shutdown_requested);
  // Whether this rank has requests of this set not yet executed (negotiated or not).
  bool HasWork() const;

  // Early staging of a small allreduce (AllreduceProvider::StagingFor): in a round in which
  // this rank has exactly one tensor ready, a cached allreduce in host memory, `stage` gets
  // its response before the bit vectors are exchanged and returns a token when it staged it,
  // and the vector carries which tensor and token this rank staged. Where all ranks staged
  // the same and the round is that tensor alone, Round::staged has the token: the round's
  // collective needs no meeting of its own for the staging, which the negotiation's already
  // was. Off until called.
  using Stage = std::function<uint64_t(const Response& response)>;
  void StageEarly(Stage stage) { stage_ = std::move(stage); }

  // Global set, coordinator: the parameters the next round puts in force (ignored elsewhere).
  void Propose(const TunedParameters& parameters) { proposal_ = parameters; }
  // Other sets: the parameters the global round of this loop iteration put in force.
  void SetParameters(const TunedParameters& parameters) { parameters_ = parameters; }
  // The parameters of the last round, and the round in which they took effect (rounds are
  // numbered alike on every rank of the set).
  const TunedParameters& parameters() const { return parameters_; }
  int64_t parameters_round() const { return parameters_round_; }

 private:
  static constexpr int kCoordinator = 0;

  // The steps of a round, in order (Negotiate).
  // Where each part of the bit vector starts: [flags][ready bits][not-stale bits]
  // [not-shutting-down bit per rank], all combined with AND, then the tuned parameters.
  struct BitLayout {
    int slots = 0;     // cache slots, a bit each
    size_t words = 0;  // words of one bit per slot
    size_t ready() const { return 1; }
    size_t not_stale() const { return 1 + words; }
    size_t not_shutting_down() const { return 1 + 2 * words; }
  };
  // Cached tensors become ready bits; the others wait for the coordinator.
  void TakeNewRequests(std::vector<Request>& new_requests);
  // This rank's bit vector; returns its layout.
  BitLayout WriteBits(bool shutdown_requested);
  // The AND over every rank (with the coordinator's proposed parameters, when this set
  // carries them), and the staging tag `staged` (StageTensor's) combined by equality, which
  // it returns: the tag where every rank gave the same, else 0.
  uint64_t AgreeOnBits(const BitLayout& layout, uint64_t staged);
  // Stages this round's only ready tensor when StageEarly allows; returns the tag the bit
  // vector carries for it (the cache slot and the token), 0 when nothing was staged.
  uint64_t StageTensor();
  // Starts the round from the agreed bits: shutdown, stale entries dropped, the cached tensors
  // ready everywhere; returns the agreed flags.
  uint64_t ReadRound(const BitLayout& layout);
  // The slow path: every rank's uncached requests to the coordinator, its responses back.
  void ExchangeUncached();
  // Coordinator only: records requests and returns the responses that became ready.
  std::vector<Response> CoordinatorCollect(const std::vector<std::vector<uint8_t>>& messages);
  // The error of a collective other than allreduce submitted while ranks have joined.
  Response JoinedError(const std::string& name, const Request& request) const;
  // Holds back members of a group until the whole group is ready, then releases them together.
  std::vector<Response> ReleaseGroups(std::vector<Response> responses);
  // Stall inspection: the coordinator asks for it in the bit vector every so often; then every
  // rank reports the cached tensors it has been waiting on (the coordinator knows the uncached
  // ones), and the coordinator's inspector warns, or stops the set past the shutdown time.
  // (stall_reports.cc)
  void ExchangeStallReports();
  // Every rank: its cached tensors waited on, for how long, and whether its caller is blocked.
  void WriteStallReport(std::chrono::steady_clock::time_point now, WireWriter& out);
  // Coordinator: every rank's report and its own table, judged; writes the verdict (the
  // rank to blame, and the message to stop with, empty to go on).
  void JudgeStallReports(const std::vector<std::vector<uint8_t>>& reports,
                         std::chrono::steady_clock::time_point now, WireWriter& verdict);
  void ToUncached(int slot);
  // Applies the previous round to the response cache, the same way on every rank: cached
  // tensors become the most recently used, new responses go in (evicting the least recently
  // used). Deferred to the next round so that the parts stay valid while they execute.
  void CommitPreviousRound();
  // Sizes the per-round storage for a round of every cached tensor, and works out the round's
  // max_parts and max_fused_bytes, when the cache or the fusion threshold changed since the
  // last call; allocates only when the cache has grown (a round that negotiated new tensors).
  void ReserveRoundStorage(std::vector<Request>& new_requests);
  // Groups round_.parts into collectives: compatible allreduces (same dtype, op, scaling,
  // device) while under the fusion threshold in bytes, and the members of a grouped call.
  // Deterministic: every rank fuses the same list the same way.
  void Fuse(int64_t threshold);

  // This rank's cached tensors ready to run: a bit per cache slot, and since when.
  bool IsCachedReady(int slot) const {
    return static_cast<size_t>(slot / 64) < cached_ready_.size() &&
           (cached_ready_[slot / 64] >> (slot % 64) & 1) != 0;
  }
  void SetCachedReady(int slot);
  bool ClearCachedReady(int slot);  // returns whether it was set
  // Switches the response cache as the parameters say; cached work goes the slow way.
  void ApplyCacheSetting();

  Link& link_;
  const Config& config_;
  ResponseCache cache_;
  const bool carries_parameters_;
  TunedParameters parameters_;
  TunedParameters proposal_;
  int64_t rounds_ = 0;
  int64_t parameters_round_ = 0;
  bool cache_active_ = true;

  // This rank's uncached requests not yet executed, by name (cached ones live in the cache).
  std::unordered_map<std::string, Request> local_;
  std::vector<Request> uncached_;  // not yet sent to the coordinator
  std::vector<uint64_t> cached_ready_;  // bit per cache slot this rank has ready
  std::vector<std::chrono::steady_clock::time_point> cached_since_;  // per slot
  bool joined_ = false;            // this rank called join() and contributes zeros

  Stage stage_;  // StageEarly's
  const Response* staged_response_ = nullptr;  // in the cache: what StageTensor staged
  uint64_t staged_token_ = 0;

  // Reused from round to round.
  Round round_;
  std::vector<uint64_t> bits_;
  std::vector<uint64_t> bits_scratch_;
  std::vector<int> ready_slots_;        // cached parts of this round, to commit next round
  std::vector<Response> decided_;       // the coordinator's responses of this round
  std::vector<const Response*> order_;  // the parts before fusion
  std::vector<char> used_;
  bool cache_changed_ = true;      // since the last ReserveRoundStorage
  int64_t reserved_threshold_ = -1;  // the fusion threshold max_fused_bytes was computed for

  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> present;
    int count = 0;
    std::chrono::steady_clock::time_point first_seen;
  };
  std::map<uint64_t, std::string> arrival_order_;  // coordinator: sequence -> name
  std::unordered_map<std::string, std::pair<uint64_t, Pending>> table_;
  uint64_t sequence_ = 0;
  std::set<int> joined_ranks_;  // coordinator: ranks waiting in join()
  int last_joined_ = -1;
  std::map<int64_t, std::vector<Response>> group_ready_;  // coordinator: group id -> members
  StallInspector stall_inspector_;  // coordinator
};

}  // namespace horovodlike
