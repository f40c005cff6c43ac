#include "link.h"

#include <string>

namespace horovodlike {
namespace {

[[noreturn]] void NoTags(const Link& link) {
  throw TransportError(std::string("the ") + link.name() + " link has no tagged messages");
}

thread_local bool t_ringing = false;
thread_local PeerBell* t_network_bell = nullptr;
thread_local const std::atomic<uint64_t>* t_arrivals = nullptr;
thread_local uint64_t t_arrivals_seen = 0;

}  // namespace

void SetNegotiationRinging(bool on, PeerBell* network) {
  t_ringing = on;
  t_network_bell = on ? network : nullptr;
}

void SetLateRinging(const std::atomic<uint64_t>* arrivals, uint64_t taken) {
  t_arrivals = arrivals;
  t_arrivals_seen = taken;
}

bool NegotiationRinging() {
  // seq_cst: pairs with the count's increment and RoundBells::WorkArrived's look (Dekker).
  return t_ringing || (t_arrivals != nullptr &&
                       t_arrivals->load(std::memory_order_seq_cst) != t_arrivals_seen);
}

bool NegotiationMayRing() { return t_ringing || t_arrivals != nullptr; }

PeerBell* NegotiationBell() { return t_network_bell; }

std::unique_ptr<Link::Request> Link::isend(int, int, const void*, size_t) { NoTags(*this); }

std::unique_ptr<Link::Request> Link::irecv(int, int, void*, size_t) { NoTags(*this); }

void Link::progress(int) { NoTags(*this); }

}  // namespace horovodlike
