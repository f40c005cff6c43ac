#include "round_bells.h"

#include <pthread.h>

#include <chrono>

#include "../links/shm/shm_link.h"
#include "../links/tcp/tcp_link.h"

namespace horovodlike {

RoundBells::RoundBells(Link& link, const Config& config, TensorQueue& queue) : queue_(queue) {
  if (TcpLink* tcp = link.tcp_mesh(); tcp != nullptr && tcp->size() > 1) {
    network_ = NetworkBell::Connect(*tcp, config.round_bell == "all");
  }
  // The host's bell by default only where it reaches every rank: in a job over several hosts
  // it cannot wake the ranks of the others, and its thread and bookkeeping cost busy sets
  // there (docs/architecture.md has the figures).
  ShmLink* shm = link.shared_memory();
  const bool host = config.round_bell == "host" || config.round_bell == "all" ||
                    (config.round_bell == "auto" && shm != nullptr &&
                     shm->size() == config.size);
  if (host && shm != nullptr && shm->size() > 1) host_ = shm;
  Start();
}

void RoundBells::Start() {
  if (host_ != nullptr) {
    host_listener_ = std::thread([this] { ListenOnHost(); });
    pthread_setname_np(host_listener_.native_handle(), "hvdl-bell");
  }
  if (network_) {
    network_listener_ = std::thread([this] { ListenOnNetwork(); });
    pthread_setname_np(network_listener_.native_handle(), "hvdl-netbell");
  }
}

void RoundBells::Stop() {
  stop_ = true;
  if (host_listener_.joinable()) {
    host_->WakeRoundListener();
    host_listener_.join();
  }
  if (network_listener_.joinable()) {
    network_->Wake();
    network_listener_.join();
  }
}

int64_t RoundBells::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

RoundBells::Round::Round(RoundBells& bells) : bells_(bells) {
  if (!bells_.active()) return;
  bells_.rounds_begun_.fetch_add(1, std::memory_order_acq_rel);
  if (bells_.host_ != nullptr) bells_.host_->RoundStarted();
}

RoundBells::Round::~Round() {
  if (bells_.host_ != nullptr) bells_.host_->RoundEnded();
}

void RoundBells::TookWork() {
  if (!active()) return;
  const int64_t now = NowNs();
  work_ns_.store(now, std::memory_order_relaxed);
  if (host_ != nullptr) host_->TookWork(now);
}

RoundBells::Negotiating::Negotiating(const RoundBells& bells,
                                     const std::vector<Request>& new_requests,
                                     const Controller& controller, bool work_elsewhere)
    : ringing_(bells.active() && work_elsewhere && new_requests.empty() &&
               !controller.HasWork()) {
  if (ringing_) SetNegotiationRinging(true, bells.network_.get());
}

RoundBells::Negotiating::~Negotiating() {
  if (ringing_) SetNegotiationRinging(false, nullptr);
}

bool RoundBells::Answered() {
  const int64_t heard = heard_at_round_.exchange(-1, std::memory_order_acq_rel);
  return rounds_begun_.load(std::memory_order_acquire) > heard || queue_.HasNewRequests();
}

void RoundBells::Heard() {
  heard_at_round_.store(rounds_begun_.load(std::memory_order_acquire), std::memory_order_release);
  queue_.Ring();
}

void RoundBells::ListenOnHost() {
  uint32_t seen = host_->round_bell();
  while (!stop_.load(std::memory_order_acquire)) {
    const uint32_t now = host_->WaitForRoundBell(seen, 200);
    if (now != seen && !stop_.load(std::memory_order_acquire)) {
      seen = now;
      Heard();
    }
  }
}

void RoundBells::ListenOnNetwork() {
  while (!stop_.load(std::memory_order_acquire)) {
    if (!network_->Wait(200) || stop_.load(std::memory_order_acquire)) continue;
    if (NowNs() - work_ns_.load(std::memory_order_relaxed) >= PeerBell::kBusyNs) Heard();
  }
}

}  // namespace horovodlike
