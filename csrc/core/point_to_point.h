// Point-to-point messages between two ranks of a process set: send and recv without a
// negotiation round, matched per (process set, sender, tag) in the order they were sent.
//
// The messages travel over links of their own (shared memory between the ranks of a host, TCP
// between hosts), apart from the collectives' connections, so a message that waits for its
// receive never holds up a collective (nor the reverse). Sends are eager: the header and payload go out at once, and the receiving rank's
// reader thread (one per peer) puts the payload straight into a posted receive or keeps it until
// one is posted, so a send completes once written and two ranks may send to each other first.
// A message that does not fit its receive fails that receive, naming both ranks, and is sent
// back as a rejection that fails the sender's pending or next operation with that peer, so both
// ranks raise. A peer whose connection closes fails every operation with it, pending or later,
// at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../common/common.h"
#include "handle_table.h"
#include "../links/link.h"

namespace horovodlike {

class PointToPoint {
 public:
  // What a send offers or a receive expects; `peer` is a rank of the job.
  struct Message {
    int set_id = 0;
    int peer = -1;
    int tag = 0;
    DataType dtype = DataType::kFloat32;
    std::vector<int64_t> shape;
  };

  // `links`: a connected mesh used by nothing else; null when this job cannot have one, and
  // then every call throws InvalidArgument with `unavailable`.
  PointToPoint(int rank, int size, std::unique_ptr<Link> links, HandleTable& handles,
               std::string unavailable);
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
  // Fails everything pending and later with `status` and closes the links (the runtime stopped).
  void Abort(const Status& status);
  // What carries the messages ("shm", "shm+tcp", "tcp"), or nullptr without links.
  const char* link_name() const { return links_ ? links_->name() : nullptr; }

 private:
  struct Header;
  struct PostedRecv;
  struct PendingSend;
  struct Arrived;
  struct Frame;
  struct Peer;

  void ReaderLoop(int peer);
  void SenderLoop();
  void HandleData(int peer, const Header& header, std::vector<int64_t> shape);
  // Hands an arrived message to a posted receive: copies it, completes the receive and answers
  // the sender.
  void DeliverLocked(int peer, PostedRecv& recv, Arrived& arrived);
  // Delivers the first kept message from `peer` that matches `recv`; false when none.
  bool TakeArrivedLocked(int peer, PostedRecv& recv);
  // Why a message does not fit a receive ("" when it does).
  std::string ProblemLocked(int peer, const PostedRecv& recv, DataType dtype,
                            const std::vector<int64_t>& shape) const;
  // Queues a rejection of the peer's message `sequence`.
  void AnswerLocked(int peer, uint64_t sequence, const std::string& problem);
  void QueueLocked(Frame frame);
  // Fails the peer's posted receives and unsent sends (all of them when set_id < 0).
  void FailPeerLocked(int peer, int set_id, const Status& status);
  void CompleteSendLocked(const std::shared_ptr<PendingSend>& send, Status status);
  // Throws InvalidArgument for bad input; returns the error an operation with this peer ends
  // with at once (a lost peer, a failure notice, a stopped runtime), or ok.
  Status CheckLocked(const Message& message, const char* what);

  std::unique_ptr<Link> links_;
  HandleTable& handles_;
  const std::string unavailable_;
  const int rank_;
  const int size_;

  std::mutex mutex_;
  std::vector<Peer> peers_;
  Status stopped_;  // ok while running
  std::deque<Frame> outgoing_;
  std::condition_variable outgoing_cv_;
  bool sender_stop_ = false;
  std::vector<std::thread> readers_;
  std::thread sender_;
};

}  // namespace horovodlike
