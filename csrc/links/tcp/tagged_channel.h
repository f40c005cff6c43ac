// The TCP link's tagged messages (link.h): a second socket per peer beside the stream's, opened
// by the same mesh set-up, so that the stream stays free of headers. A message is a frame, a
// 16-byte header {magic, tag, bytes} and the payload, written with one sendmsg; frames are read
// in bulk into a small buffer (many small messages per recv) and a large payload straight into
// the receive posted for it. No thread: whoever tests or waits moves every peer's frames along,
// under one lock, and keeps those no receive was posted for yet, per (peer, tag).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../link.h"
#include "../tagged_inbox.h"

namespace horovodlike {

class TaggedChannel {
 public:
  // `fds[peer]`: the connected non-blocking socket to each peer, -1 for this rank; taken over.
  TaggedChannel(int rank, std::vector<int> fds, int timeout_ms);
  ~TaggedChannel();
  TaggedChannel(const TaggedChannel&) = delete;
  TaggedChannel& operator=(const TaggedChannel&) = delete;

  std::unique_ptr<Link::Request> Send(int peer, int tag, const void* buf, size_t n);
  std::unique_ptr<Link::Request> Recv(int peer, int tag, void* buf, size_t n);
  // `wake_fd` (when not -1): a descriptor whose becoming readable also ends the wait.
  void Progress(int timeout_ms, int wake_fd = -1);
  // Shuts every socket down: pending and later requests fail.
  void Abort();
  void set_timeout_ms(int timeout_ms) { timeout_ms_ = timeout_ms; }

 private:
  using Op = TaggedOp;
  struct Peer;
  class TcpRequest;

  // Moves every peer along without waiting; true when a request completed.
  bool PumpLocked();
  bool WriteLocked(int peer);
  bool ReadLocked(int peer);
  void FailPeerLocked(int peer, const std::string& what, TransportError::Cause cause);
  // Sleeps until a socket of a peer with work may move, at most timeout_ms.
  void PollPeers(int timeout_ms, int wake_fd = -1);
  void Wait(Op& op);
  void CheckPeer(int peer) const;

  const int rank_;
  std::atomic<int> timeout_ms_;
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::vector<Peer> peers_;
};

}  // namespace horovodlike
