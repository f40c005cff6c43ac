// The round bells of one rank (links/link.h says what they are for): the listeners that wake
// this rank's loop when a peer rings, and the bookkeeping the rounds keep for them.
//
// Every round negotiates every process set of the rank, the global one first, so a rank
// outside a set that has nothing to do would hold the set's collectives back until its loop's
// next cycle (HOROVOD_CYCLE_TIME). A negotiation of a set in which this rank has no work of
// its own rings the peers it waits for (inside a host: ShmLink::RingIfIdle; between hosts:
// NetworkBell); a listener thread here then wakes the loop with TensorQueue::Ring.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "controller.h"
#include "tensor_queue.h"
#include "../common/env_config.h"
#include "../links/link.h"
#include "../links/tcp/network_bell.h"

namespace horovodlike {

class RoundBells {
 public:
  // HOROVOD_ROUND_BELL (config.round_bell) says which bells ring; the network bell's exchange
  // over the link's TCP mesh is collective whatever it says (every rank calls this at the same
  // point, before any other thread uses the mesh), then starts the listeners.
  RoundBells(Link& link, const Config& config, TensorQueue& queue);
  ~RoundBells() { Stop(); }
  void Stop();

  // For the duration of a round (it marks this rank in one, for the host's peers).
  class Round {
   public:
    explicit Round(RoundBells& bells);
    ~Round();
   private:
    RoundBells& bells_;
  };
  // The round took in requests of its own.
  void TookWork();
  // For the duration of one set's negotiation (on the thread running it): rings when this
  // rank has no work of its own in the set (no `new_requests`, nothing left in `controller`)
  // but has some in another set (`work_elsewhere`), which this set's peers hold back. A rank
  // with no work anywhere keeps in step without ringing: its peers' rounds would find nothing
  // to do either (an idle job's rounds would ring each other awake every cycle).
  class Negotiating {
   public:
    Negotiating(const RoundBells& bells, const std::vector<Request>& new_requests,
                const Controller& controller, bool work_elsewhere);
    ~Negotiating();
   private:
    bool ringing_;
  };
  // Whether the loop, woken by a bell, need not run a round: one began since it rang (it met
  // the ringing rank's negotiation), or requests are queued, whose caller (or the loop, woken
  // for them) runs one; the loop running a waiting caller's round would cost it two thread
  // wake-ups.
  bool Answered();
  // Whether any bell rings: without one a round keeps nothing for them.
  bool active() const { return host_ != nullptr || network_ != nullptr; }
  // Bells this rank rang to peers on other hosts; -1 without a network bell.
  int64_t network_rings() const { return network_ ? network_->rings() : -1; }

 private:
  void Start();
  void ListenOnHost();
  void ListenOnNetwork();
  void Heard();
  static int64_t NowNs();

  TensorQueue& queue_;
  ShmLink* host_ = nullptr;                 // the host's bell, when it rings
  std::unique_ptr<NetworkBell> network_;    // the bell between hosts, when it rings
  // Rounds begun, and their count when a bell was last heard.
  std::atomic<int64_t> rounds_begun_{0};
  std::atomic<int64_t> heard_at_round_{-1};
  // When (steady clock, ns) a round last took in requests: a network bell heard within
  // PeerBell::kBusyNs of it is let go (the peer that rang cannot see that this rank is busy,
  // as a peer on the host can).
  std::atomic<int64_t> work_ns_{0};
  std::atomic<bool> stop_{false};
  std::thread host_listener_;
  std::thread network_listener_;
};

}  // namespace horovodlike
