// Point-to-point messages between two ranks of a process set: send and recv without a
// negotiation round, matched per (process set, sender, tag) in the order they were sent.
//
// The messages are the link's tagged messages (links/link.h) on the job's own connections,
// beside the collectives' stream and never in it, so a message that waits for its receive
// never holds up a collective (nor the reverse). Each is two link messages: a frame header
// (with the shape) and the payload. Sends are eager: both are written at once as far as the
// connection takes them. No thread of ours reads: a rank waiting for (or polling) a handle moves
// every peer's messages along (Progress), putting a payload straight into a posted receive or
// keeping it until one is posted, so two ranks may send to each other first. The rest of a
// send too large for the connection's buffers goes out when this rank next waits for a
// handle of its own.
// A message that does not fit its receive fails that receive, naming both ranks, and is sent
// back as a rejection that fails the sender's pending or next operation with that peer, so both
// ranks raise. A peer whose connection closes fails every operation with it, pending or later.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/common.h"
#include "handle_table.h"
#include "../links/link.h"

namespace horovodlike {

class PointToPoint {
 public:
  struct Header;  // of a frame on the wire
  // What a send offers or a receive expects; `peer` is a rank of the job.
  struct Message {
    int set_id = 0;
    int peer = -1;
    int tag = 0;
    DataType dtype = DataType::kFloat32;
    std::vector<int64_t> shape;
  };

  // `link`: the job's link, not owned; null when this job cannot have point-to-point, and then
  // every call throws InvalidArgument with `unavailable`.
  PointToPoint(int rank, int size, Link* link, HandleTable& handles, std::string unavailable);
  ~PointToPoint();

  // Both return a handle at once. `data` stays valid until the handle completes.
  int64_t Send(const Message& message, const void* data);
  // `data` null: the core allocates the buffer with the sender's dtype and shape (the handle's
  // output, output_shape, and integers = {dtype code}); the receive then matches any dtype
  // and shape.
  int64_t Recv(const Message& message, void* data);
  // Tells `peers` that this rank failed while working with them in process set `set_id`: their
  // pending and later operations with this rank in that set fail with `reason`.
  void NotifyFailure(int set_id, const std::vector<int>& peers, const std::string& reason);
  // Fails everything pending and later with `status` (the runtime stopped).
  void Abort(const Status& status);
  // What carries the messages ("tcp", "mpi"), or nullptr without a link.
  const char* link_name() const { return link_ ? link_->tagged_name() : nullptr; }
  // Moves every peer's messages along, waiting at most `seconds` for something to happen
  // (a handle's waits and polls call it).
  void Progress(double seconds);

 private:
  struct PostedRecv;
  struct PendingSend;
  struct Arrived;
  struct Notice;
  struct Incoming;
  struct Peer;

  // Moves what the link completed along: finished sends, arrived headers and payloads.
  void StepLocked();
  // One peer; throws TransportError when its connection is lost.
  void StepPeerLocked(int peer);
  // A frame header arrived from `peer`.
  void OnHeaderLocked(int peer, const std::vector<uint8_t>& bytes);
  void OnDataHeaderLocked(int peer, const Header& header, std::vector<int64_t> shape);
  void OnNoticeLocked(int peer, const Header& header, const std::string& text);
  // The payload of the frame in Incoming arrived (or the frame had none).
  void FinishIncomingLocked(int peer);
  // Hands an arrived message to a posted receive: copies it, completes the receive and answers
  // the sender.
  void DeliverLocked(int peer, PostedRecv& recv, Arrived& arrived);
  // Delivers the first kept message from `peer` that matches `recv`; false when none.
  bool TakeArrivedLocked(int peer, PostedRecv& recv);
  // Why a message does not fit a receive ("" when it does).
  std::string ProblemLocked(int peer, const PostedRecv& recv, DataType dtype,
                            const std::vector<int64_t>& shape) const;
  // Sends a rejection of the peer's message `sequence`, or a failure notice.
  void SendNoticeLocked(int peer, uint32_t kind, int set_id, uint64_t sequence,
                        const std::string& text);
  // Fails the peer's posted receives and unsent sends (all of them when set_id < 0); returns
  // how many it failed.
  size_t FailPeerLocked(int peer, int set_id, const Status& status);
  // The connection to `peer` broke (`what` says how): everything with it fails.
  void LosePeerLocked(int peer, const std::string& what);
  // Completes the sends written in full and forgets the notices written.
  void FinishSendsLocked(int peer);
  Status LostStatus(int peer, const std::string& what) const;
  // A handle whose waits move the messages along.
  int64_t CreateHandleLocked(std::shared_ptr<HandleState>* state);
  // Throws InvalidArgument for bad input; returns the error an operation with this peer ends
  // with at once (a lost peer, a failure notice, a stopped runtime), or ok.
  Status CheckLocked(const Message& message, const char* what);

  Link* const link_;
  HandleTable& handles_;
  const std::string unavailable_;
  const int rank_;
  const int size_;

  std::mutex mutex_;
  std::vector<Peer> peers_;
  Status stopped_;  // ok while running
};

}  // namespace horovodlike
