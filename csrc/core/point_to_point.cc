#include "point_to_point.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>


namespace horovodlike {
namespace {

constexpr uint32_t kFrameMagic = 0x32505648;  // "HVP2"
enum FrameKind : uint32_t { kData = 1, kReject = 3, kFailure = 4 };
constexpr int kMaxDims = 32;
constexpr uint64_t kMaxTextBytes = 1 << 20;
constexpr size_t kDiscardChunk = 1 << 16;

std::string SetName(int set_id) {
  return set_id == 0 ? std::string() : " in process set " + std::to_string(set_id);
}

std::string Offer(DataType dtype, const std::vector<int64_t>& shape) {
  return std::string(DataTypeName(dtype)) + " " + ShapeString(shape);
}

}  // namespace

// The fixed part of every frame; a data frame follows it with `ndim` int64 dimensions, then
// `body_bytes` of payload; a rejection or failure notice with `body_bytes` of text.
struct PointToPoint::Header {
  uint32_t magic = kFrameMagic;
  uint32_t kind = kData;
  int32_t set_id = 0;
  int32_t tag = 0;
  int32_t dtype = 0;
  int32_t ndim = 0;
  uint64_t sequence = 0;  // data: the sender's number for it; reject: the number rejected
  uint64_t body_bytes = 0;
};

struct PointToPoint::PostedRecv {
  Message message;
  void* data = nullptr;  // null: allocate with the sender's dtype and shape
  std::shared_ptr<HandleState> state;
};

struct PointToPoint::PendingSend {
  int set_id = 0;
  std::shared_ptr<HandleState> state;
  // The sender thread is writing its payload: the caller's buffer is in use, so a failure
  // meanwhile is kept in `deferred` and reported once the write returns.
  bool in_flight = false;
  bool has_deferred = false;
  Status deferred;
};

struct PointToPoint::Arrived {
  int set_id = 0;
  int tag = 0;
  DataType dtype = DataType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t sequence = 0;
  std::vector<uint8_t> bytes;
};

struct PointToPoint::Frame {
  int peer = -1;
  Header header;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // a send's payload, owned by the caller
  std::string text;            // a rejection's or failure notice's message
  std::shared_ptr<PendingSend> send;
};

struct PointToPoint::Peer {
  std::deque<PostedRecv> posted;
  std::deque<Arrived> arrived;  // messages no receive was posted for yet, in arrival order
  std::map<uint64_t, std::shared_ptr<PendingSend>> unsent;  // queued or being written
  uint64_t next_sequence = 0;
  Status lost;                             // the connection broke
  std::map<int, std::string> failed_sets;  // set id -> the peer's failure notice
  // set id -> the peer's rejection of a message this rank sent, for the next operation with
  // the peer in that set when none was pending.
  std::map<int, std::string> rejections;
};

PointToPoint::PointToPoint(int rank, int size, std::unique_ptr<Link> links,
                           HandleTable& handles, std::string unavailable)
    : links_(std::move(links)), handles_(handles), unavailable_(std::move(unavailable)),
      rank_(rank), size_(size), peers_(size) {
  static_assert(sizeof(Header) == 40, "wire structs must not be padded");
  if (!links_) return;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    readers_.emplace_back([this, peer] { ReaderLoop(peer); });
    pthread_setname_np(readers_.back().native_handle(), "hvdl-p2p-recv");
  }
  sender_ = std::thread([this] { SenderLoop(); });
  pthread_setname_np(sender_.native_handle(), "hvdl-p2p-send");
}

PointToPoint::~PointToPoint() {
  Abort(Status::Error(StatusCode::kShutdown, "horovodlike was shut down"));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sender_stop_ = true;
  }
  outgoing_cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  for (std::thread& reader : readers_) reader.join();
}

Status PointToPoint::CheckLocked(const Message& message, const char* what) {
  const std::string call = std::string(what) + " on rank " + std::to_string(rank_);
  if (message.peer < 0 || message.peer >= size_) {
    throw InvalidArgument(call + ": rank " + std::to_string(message.peer) +
                          " is not a rank of this job (ranks 0 to " + std::to_string(size_ - 1) +
                          ")");
  }
  if (message.peer == rank_) {
    throw InvalidArgument(call + ": the peer is this rank itself; point-to-point needs two "
                          "different ranks");
  }
  if (message.tag < 0) {
    throw InvalidArgument(call + ": tag " + std::to_string(message.tag) +
                          " is negative; tags are integers from 0 to 2**31 - 1");
  }
  for (int64_t d : message.shape) {
    if (d < 0) throw InvalidArgument(call + ": the tensor has a negative dimension");
  }
  if (static_cast<int>(message.shape.size()) > kMaxDims) {
    throw InvalidArgument(call + ": tensors of more than " + std::to_string(kMaxDims) +
                          " dimensions are not supported");
  }
  if (!links_) throw InvalidArgument(call + ": " + unavailable_);
  if (!stopped_.ok()) return stopped_;
  Peer& peer = peers_[message.peer];
  if (!peer.lost.ok()) return peer.lost;
  auto failed = peer.failed_sets.find(message.set_id);
  if (failed != peer.failed_sets.end()) {
    return Status::Error(StatusCode::kInternal, failed->second);
  }
  auto rejected = peer.rejections.find(message.set_id);
  if (rejected != peer.rejections.end()) {
    Status status = Status::Error(StatusCode::kMismatch, rejected->second);
    peer.rejections.erase(rejected);
    return status;
  }
  return Status::Ok();
}

int64_t PointToPoint::Send(const Message& message, const void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Status early = CheckLocked(message, "send");
  const int64_t handle = handles_.Create();
  auto state = handles_.Get(handle);
  if (!early.ok()) {
    handles_.Complete(state, early);
    return handle;
  }
  Peer& peer = peers_[message.peer];
  auto send = std::make_shared<PendingSend>();
  send->set_id = message.set_id;
  send->state = state;
  Frame frame;
  frame.peer = message.peer;
  frame.header.kind = kData;
  frame.header.set_id = message.set_id;
  frame.header.tag = message.tag;
  frame.header.dtype = static_cast<int32_t>(message.dtype);
  frame.header.ndim = static_cast<int32_t>(message.shape.size());
  frame.header.sequence = peer.next_sequence++;
  frame.header.body_bytes = NumElements(message.shape) * DataTypeSize(message.dtype);
  frame.shape = message.shape;
  frame.data = data;
  frame.send = send;
  peer.unsent[frame.header.sequence] = send;
  QueueLocked(std::move(frame));
  return handle;
}

int64_t PointToPoint::Recv(const Message& message, void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Status early = CheckLocked(message, "recv");
  const int64_t handle = handles_.Create();
  auto state = handles_.Get(handle);
  PostedRecv recv{message, data, state};
  // A message that arrived before its sender was lost or reported a failure is still
  // delivered, as a closed socket's data is read before its end: a rank may send its last
  // message and shut down at once. A rejection of this rank's own message is reported first.
  const bool deliverable = early.ok() || (stopped_.ok() && early.code != StatusCode::kMismatch);
  if (deliverable && TakeArrivedLocked(message.peer, recv)) return handle;
  if (!early.ok()) {
    handles_.Complete(state, early);
    return handle;
  }
  peers_[message.peer].posted.push_back(std::move(recv));
  return handle;
}

bool PointToPoint::TakeArrivedLocked(int peer_rank, PostedRecv& recv) {
  Peer& peer = peers_[peer_rank];
  for (auto it = peer.arrived.begin(); it != peer.arrived.end(); ++it) {
    if (it->set_id == recv.message.set_id && it->tag == recv.message.tag) {
      Arrived arrived = std::move(*it);
      peer.arrived.erase(it);
      DeliverLocked(peer_rank, recv, arrived);
      return true;
    }
  }
  return false;
}

std::string PointToPoint::ProblemLocked(int peer, const PostedRecv& recv, DataType dtype,
                                        const std::vector<int64_t>& shape) const {
  if (recv.data == nullptr) return "";
  const Message& m = recv.message;
  if (dtype == m.dtype && NumElements(shape) == NumElements(m.shape)) return "";
  return "point-to-point mismatch: rank " + std::to_string(peer) + " sent " +
         Offer(dtype, shape) + " with tag " + std::to_string(m.tag) + SetName(m.set_id) +
         " to rank " + std::to_string(rank_) + ", whose recv from rank " + std::to_string(peer) +
         " with that tag expects " + Offer(m.dtype, m.shape) +
         "; the dtype and the number of elements must agree";
}

void PointToPoint::DeliverLocked(int peer, PostedRecv& recv, Arrived& arrived) {
  const std::string problem = ProblemLocked(peer, recv, arrived.dtype, arrived.shape);
  if (!problem.empty()) {
    handles_.Complete(recv.state, Status::Error(StatusCode::kMismatch, problem));
  } else {
    if (recv.data != nullptr) {
      if (!arrived.bytes.empty()) {
        std::memcpy(recv.data, arrived.bytes.data(), arrived.bytes.size());
      }
    } else {
      recv.state->output = std::move(arrived.bytes);
      recv.state->output_shape = arrived.shape;
      recv.state->integers = {static_cast<int64_t>(arrived.dtype)};
    }
    handles_.Complete(recv.state, Status::Ok());
  }
  if (!problem.empty()) AnswerLocked(peer, arrived.sequence, problem);
}

void PointToPoint::AnswerLocked(int peer, uint64_t sequence, const std::string& problem) {
  Frame frame;
  frame.peer = peer;
  frame.header.kind = kReject;
  frame.header.sequence = sequence;
  frame.header.body_bytes = problem.size();
  frame.text = problem;
  QueueLocked(std::move(frame));
}

void PointToPoint::QueueLocked(Frame frame) {
  if (!peers_[frame.peer].lost.ok() || !stopped_.ok()) return;
  outgoing_.push_back(std::move(frame));
  outgoing_cv_.notify_one();
}

void PointToPoint::NotifyFailure(int set_id, const std::vector<int>& peers,
                                 const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!links_) return;
  for (int peer : peers) {
    if (peer < 0 || peer >= size_ || peer == rank_) continue;
    Frame frame;
    frame.peer = peer;
    frame.header.kind = kFailure;
    frame.header.set_id = set_id;
    frame.header.body_bytes = reason.size();
    frame.text = reason;
    QueueLocked(std::move(frame));
  }
}

void PointToPoint::CompleteSendLocked(const std::shared_ptr<PendingSend>& send, Status status) {
  if (send->in_flight) {
    if (!send->has_deferred) {
      send->has_deferred = true;
      send->deferred = std::move(status);
    }
    return;
  }
  handles_.Complete(send->state, std::move(status));
}

void PointToPoint::FailPeerLocked(int peer_rank, int set_id, const Status& status) {
  Peer& peer = peers_[peer_rank];
  auto in_scope = [set_id](int id) { return set_id < 0 || id == set_id; };
  for (auto it = peer.posted.begin(); it != peer.posted.end();) {
    if (!in_scope(it->message.set_id)) {
      ++it;
      continue;
    }
    handles_.Complete(it->state, status);
    it = peer.posted.erase(it);
  }
  // Unsent payloads leave the queue before their sends complete: the caller may free them then.
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    const bool drop = it->peer == peer_rank &&
                      (set_id < 0 || (it->send && it->send->set_id == set_id));
    it = drop ? outgoing_.erase(it) : it + 1;
  }
  for (auto it = peer.unsent.begin(); it != peer.unsent.end();) {
    if (!in_scope(it->second->set_id)) {
      ++it;
      continue;
    }
    CompleteSendLocked(it->second, status);
    it = peer.unsent.erase(it);
  }
}

void PointToPoint::Abort(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_.ok()) return;
    stopped_ = status;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) FailPeerLocked(peer, -1, status);
    }
    outgoing_.clear();
  }
  if (links_) links_->abort();
}

void PointToPoint::SenderLoop() {
  while (true) {
    Frame frame;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      outgoing_cv_.wait(lock, [&] { return sender_stop_ || !outgoing_.empty(); });
      if (outgoing_.empty()) return;  // stopping
      frame = std::move(outgoing_.front());
      outgoing_.pop_front();
      if (frame.send) frame.send->in_flight = true;
    }
    Status error;
    try {
      links_->send(frame.peer, &frame.header, sizeof(frame.header));
      if (!frame.shape.empty()) {
        links_->send(frame.peer, frame.shape.data(), frame.shape.size() * sizeof(int64_t));
      }
      if (frame.data != nullptr && frame.header.body_bytes > 0) {
        links_->send(frame.peer, frame.data, frame.header.body_bytes);
      }
      if (!frame.text.empty()) links_->send(frame.peer, frame.text.data(), frame.text.size());
    } catch (const TransportError& e) {
      error = Status::Error(StatusCode::kInternal,
                            "point-to-point on rank " + std::to_string(rank_) +
                                ": lost connection to rank " + std::to_string(frame.peer) +
                                " (it exited, was killed or shut down): " + e.what());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (frame.send) {
      // Written: the caller may reuse the buffer (the receiver keeps the message until a
      // receive matches it). A send written in full has succeeded even when the peer's failure
      // notice arrived meanwhile (the peer may have taken it and failed afterwards; the notice
      // fails the later operations), but it carries the rejection of an earlier message, which
      // is reported nowhere else. One cut short fails with the reason that came first.
      frame.send->in_flight = false;
      peers_[frame.peer].unsent.erase(frame.header.sequence);
      const Status& deferred = frame.send->deferred;
      const bool rejection = frame.send->has_deferred && deferred.code == StatusCode::kMismatch;
      handles_.Complete(frame.send->state, !error.ok() && frame.send->has_deferred ? deferred
                                           : !error.ok() ? error
                                           : rejection ? deferred : Status::Ok());
    }
    if (!error.ok() && stopped_.ok() && peers_[frame.peer].lost.ok()) {
      peers_[frame.peer].lost = error;
      FailPeerLocked(frame.peer, -1, error);
    }
  }
}

void PointToPoint::ReaderLoop(int peer_rank) {
  try {
    while (true) {
      Header header;
      links_->recv(peer_rank, &header, sizeof(header));
      const std::string from = "a point-to-point frame from rank " + std::to_string(peer_rank);
      if (header.magic != kFrameMagic) throw TransportError(from + " is corrupt", peer_rank);
      if (header.kind == kData) {
        if (!IsValidDataType(header.dtype) || header.ndim < 0 || header.ndim > kMaxDims) {
          throw TransportError(from + " has a bad dtype or rank", peer_rank);
        }
        std::vector<int64_t> shape(header.ndim);
        if (header.ndim > 0) {
          links_->recv(peer_rank, shape.data(), shape.size() * sizeof(int64_t));
        }
        for (int64_t d : shape) {
          if (d < 0 || d > (int64_t{1} << 48)) throw TransportError(from + " has a bad shape");
        }
        if (NumElements(shape) * DataTypeSize(static_cast<DataType>(header.dtype)) !=
            header.body_bytes) {
          throw TransportError(from + " has a payload that does not match its shape", peer_rank);
        }
        HandleData(peer_rank, header, std::move(shape));
        continue;
      }
      if (header.kind != kReject && header.kind != kFailure) {
        throw TransportError(from + " is of an unknown kind", peer_rank);
      }
      if (header.body_bytes > kMaxTextBytes) throw TransportError(from + " is too long");
      std::string text(header.body_bytes, '\0');
      if (!text.empty()) links_->recv(peer_rank, text.data(), text.size());
      std::lock_guard<std::mutex> lock(mutex_);
      Peer& peer = peers_[peer_rank];
      if (header.kind == kFailure) {
        peer.failed_sets[header.set_id] = text;
        FailPeerLocked(peer_rank, header.set_id, Status::Error(StatusCode::kInternal, text));
        continue;
      }
      // A message this rank sent did not fit the peer's receive. The send completed (it was
      // written, as the peer has read it); the rejection fails what is pending with the peer in
      // that set, or else the next operation with it, so that this rank raises as well as the
      // receiver. The rejected send itself may not be marked complete yet, the sender thread
      // still on its way back from the write: it is no operation pending, or which call raises
      // would depend on that thread's timing.
      std::shared_ptr<PendingSend> rejected;
      auto written = peer.unsent.find(header.sequence);
      if (written != peer.unsent.end()) {
        rejected = written->second;
        peer.unsent.erase(written);
      }
      const size_t pending = peer.posted.size() + peer.unsent.size();
      FailPeerLocked(peer_rank, header.set_id, Status::Error(StatusCode::kMismatch, text));
      if (peer.posted.size() + peer.unsent.size() == pending) {
        peer.rejections[header.set_id] = text;
      }
      if (rejected) peer.unsent[header.sequence] = rejected;
    }
  } catch (const TransportError& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_.ok()) return;  // shut down or aborted: already failed with that reason
    if (!peers_[peer_rank].lost.ok()) return;
    Status lost = Status::Error(
        StatusCode::kInternal, "point-to-point on rank " + std::to_string(rank_) +
                                   ": lost connection to rank " + std::to_string(peer_rank) +
                                   " (it exited, was killed or shut down): " + e.what());
    peers_[peer_rank].lost = lost;
    FailPeerLocked(peer_rank, -1, lost);
  }
}

void PointToPoint::HandleData(int peer_rank, const Header& header, std::vector<int64_t> shape) {
  const DataType dtype = static_cast<DataType>(header.dtype);
  PostedRecv recv;
  bool matched = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& peer = peers_[peer_rank];
    for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
      if (it->message.set_id == header.set_id && it->message.tag == header.tag) {
        recv = std::move(*it);
        peer.posted.erase(it);
        matched = true;
        break;
      }
    }
  }
  if (matched) {
    // Read straight into the receive's buffer; nothing else completes it meanwhile, since it
    // left the posted list.
    std::string problem;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      problem = ProblemLocked(peer_rank, recv, dtype, shape);
    }
    try {
      if (!problem.empty()) {
        std::vector<uint8_t> scratch(std::min<uint64_t>(header.body_bytes, kDiscardChunk));
        for (uint64_t left = header.body_bytes; left > 0;) {
          const size_t n = std::min<uint64_t>(left, scratch.size());
          links_->recv(peer_rank, scratch.data(), n);
          left -= n;
        }
      } else if (recv.data != nullptr) {
        if (header.body_bytes > 0) links_->recv(peer_rank, recv.data, header.body_bytes);
      } else {
        recv.state->output.resize(header.body_bytes);
        if (header.body_bytes > 0) {
          links_->recv(peer_rank, recv.state->output.data(), header.body_bytes);
        }
        recv.state->output_shape = shape;
        recv.state->integers = {static_cast<int64_t>(dtype)};
      }
    } catch (const TransportError& e) {
      handles_.Complete(recv.state,
                        Status::Error(StatusCode::kInternal,
                                      "point-to-point on rank " + std::to_string(rank_) +
                                          ": lost connection to rank " +
                                          std::to_string(peer_rank) + " while receiving: " +
                                          e.what()));
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    handles_.Complete(recv.state, problem.empty()
                                      ? Status::Ok()
                                      : Status::Error(StatusCode::kMismatch, problem));
    if (!problem.empty()) AnswerLocked(peer_rank, header.sequence, problem);
    return;
  }
  Arrived arrived;
  arrived.set_id = header.set_id;
  arrived.tag = header.tag;
  arrived.dtype = dtype;
  arrived.shape = std::move(shape);
  arrived.sequence = header.sequence;
  arrived.bytes.resize(header.body_bytes);
  if (header.body_bytes > 0) links_->recv(peer_rank, arrived.bytes.data(), header.body_bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& peer = peers_[peer_rank];
  // A receive posted while the payload was read did not find it among the arrived ones.
  for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
    if (it->message.set_id == arrived.set_id && it->message.tag == arrived.tag) {
      PostedRecv late = std::move(*it);
      peer.posted.erase(it);
      DeliverLocked(peer_rank, late, arrived);
      return;
    }
  }
  peer.arrived.push_back(std::move(arrived));
}

}  // namespace horovodlike
