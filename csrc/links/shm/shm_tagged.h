// The shared-memory link's tagged messages (link.h): a ring per ordered pair of ranks of its
// own, beside the stream's rings, so that point-to-point and pipelines between ranks of one
// host stay off the loopback and never interleave with a collective's bytes. A message is a
// 16-byte header {magic, tag, bytes} and its payload, streamed through the ring in slices; the
// header is published together with the first slice, so a reader sees all of it or nothing.
// The payload is copied out straight into the receive posted for it, or into a buffer kept for
// a later receive. No thread: whoever tests or waits moves every peer's messages along, under
// one lock, and sleeps on the rank's doorbell (shm_link.h) like the stream's waits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shm_layout.h"
#include "../link.h"
#include "../tagged_inbox.h"

namespace horovodlike {

class ShmLink;

class ShmTaggedChannel {
 public:
  explicit ShmTaggedChannel(ShmLink& link);
  ~ShmTaggedChannel();
  ShmTaggedChannel(const ShmTaggedChannel&) = delete;
  ShmTaggedChannel& operator=(const ShmTaggedChannel&) = delete;

  // Peers are ranks within the link's group.
  std::unique_ptr<Link::Request> Send(int peer, int tag, const void* buf, size_t n);
  std::unique_ptr<Link::Request> Recv(int peer, int tag, void* buf, size_t n);
  void Progress(int timeout_ms);
  // Lock-free: whether a pump would move something (bytes to read, room for a queued send).
  bool WorkWaiting() const;

 private:
  using Op = TaggedOp;
  struct Peer;
  class ShmRequest;

  shm::ChannelControl& control(int from, int to) const;
  uint8_t* ring(int from, int to) const;
  // Moves every peer along without waiting; true when a request completed.
  bool PumpLocked();
  bool WriteLocked(int peer);
  bool ReadLocked(int peer);
  // Fails a peer whose process stopped, once everything it wrote was read; the processes
  // themselves are looked at no more often than every few milliseconds.
  void CheckPeersLocked();
  void FailPeerLocked(int peer, const std::string& why, TransportError::Cause cause);
  void FailAllLocked(const std::string& why);
  // Wakes this rank's other threads that sleep in a wait, after a pump completed requests.
  void WakeOwnWaiters();
  void Wait(Op& op);
  std::string PeerName(int peer) const;

  ShmLink& link_;
  const int me_;
  size_t bytes_ = 0;  // one ring
  size_t slice_ = 0;  // published at least this often
  std::mutex mutex_;
  std::vector<Peer> peers_;
  // Per peer, readable without the lock: sends are queued / it is lost.
  std::unique_ptr<std::atomic<bool>[]> sending_;
  std::unique_ptr<std::atomic<bool>[]> lost_;
  std::chrono::steady_clock::time_point last_process_check_;
};

}  // namespace horovodlike
