#include "point_to_point.h"
#include "point_to_point_frames.h"

#include <algorithm>
#include <cstring>


namespace horovodlike {

using namespace p2p_frames;  // NOLINT(build/namespaces): this file's own wire constants

namespace {

std::string SetName(int set_id) {
  return set_id == 0 ? std::string() : " in process set " + std::to_string(set_id);
}

std::string Offer(DataType dtype, const std::vector<int64_t>& shape) {
  return std::string(DataTypeName(dtype)) + " " + ShapeString(shape);
}

}  // namespace

PointToPoint::PointToPoint(int rank, int size, Link* link, HandleTable& handles,
                           std::string unavailable)
    : link_(link), handles_(handles), unavailable_(std::move(unavailable)), rank_(rank),
      size_(size), peers_(size) {
  static_assert(sizeof(Header) == 40, "wire structs must not be padded");
  if (!link_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    try {
      peers_[peer].header = link_->irecv(peer, kHeaderTag, peers_[peer].header_bytes.data(),
                                         kHeaderBytes);
    } catch (const TransportError& e) {
      LosePeerLocked(peer, e.what());
    }
  }
}

PointToPoint::~PointToPoint() {
  Abort(Status::Error(StatusCode::kShutdown, "horovodlike was shut down"));
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
  if (!link_) throw InvalidArgument(call + ": " + unavailable_);
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

int64_t PointToPoint::CreateHandleLocked(std::shared_ptr<HandleState>* state) {
  const int64_t handle = handles_.Create();
  *state = handles_.Get(handle);
  (*state)->progress = [this](double seconds) { Progress(seconds); };
  return handle;
}

int64_t PointToPoint::Send(const Message& message, const void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Status early = CheckLocked(message, "send");
  std::shared_ptr<HandleState> state;
  const int64_t handle = CreateHandleLocked(&state);
  if (!early.ok()) {
    handles_.Complete(state, early);
    return handle;
  }
  Peer& peer = peers_[message.peer];
  Header header;
  header.kind = kData;
  header.set_id = message.set_id;
  header.tag = message.tag;
  header.dtype = static_cast<int32_t>(message.dtype);
  header.ndim = static_cast<int32_t>(message.shape.size());
  header.sequence = peer.next_sequence++;
  header.body_bytes = NumElements(message.shape) * DataTypeSize(message.dtype);
  auto send = std::make_shared<PendingSend>();
  send->set_id = message.set_id;
  send->state = state;
  send->head.resize(kHeaderBytes);
  std::memcpy(send->head.data(), &header, sizeof(Header));
  if (!message.shape.empty()) {
    std::memcpy(send->head.data() + sizeof(Header), message.shape.data(),
                message.shape.size() * sizeof(int64_t));
  }
  try {
    send->head_request = link_->isend(message.peer, kHeaderTag, send->head.data(),
                                      send->head.size());
    if (header.body_bytes > 0) {
      send->body_request = link_->isend(message.peer, kPayloadTag, data, header.body_bytes);
    }
  } catch (const TransportError& e) {
    peer.unsent[header.sequence] = send;
    LosePeerLocked(message.peer, e.what());
    return handle;
  }
  peer.unsent[header.sequence] = send;
  StepLocked();
  return handle;
}

int64_t PointToPoint::Recv(const Message& message, void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Status early = CheckLocked(message, "recv");
  std::shared_ptr<HandleState> state;
  const int64_t handle = CreateHandleLocked(&state);
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
  StepLocked();
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
  if (!problem.empty()) {
    SendNoticeLocked(peer, kReject, recv.message.set_id, arrived.sequence, problem);
  }
}

void PointToPoint::SendNoticeLocked(int peer_rank, uint32_t kind, int set_id, uint64_t sequence,
                                    const std::string& text) {
  Peer& peer = peers_[peer_rank];
  if (!peer.lost.ok() || !stopped_.ok()) return;
  Header header;
  header.kind = kind;
  header.set_id = set_id;
  header.sequence = sequence;
  header.body_bytes = text.size();
  Notice notice;
  notice.head.resize(kHeaderBytes);
  std::memcpy(notice.head.data(), &header, sizeof(Header));
  notice.text = text;
  try {
    notice.head_request = link_->isend(peer_rank, kHeaderTag, notice.head.data(), kHeaderBytes);
    if (!text.empty()) {
      notice.text_request = link_->isend(peer_rank, kPayloadTag, notice.text.data(),
                                         notice.text.size());
    }
  } catch (const TransportError& e) {
    LosePeerLocked(peer_rank, e.what());
    return;
  }
  peer.notices.push_back(std::move(notice));
}

void PointToPoint::NotifyFailure(int set_id, const std::vector<int>& peers,
                                 const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!link_) return;
  for (int peer : peers) {
    if (peer < 0 || peer >= size_ || peer == rank_) continue;
    SendNoticeLocked(peer, kFailure, set_id, 0, reason);
  }
  StepLocked();
}

size_t PointToPoint::FailPeerLocked(int peer_rank, int set_id, const Status& status) {
  Peer& peer = peers_[peer_rank];
  auto in_scope = [set_id](int id) { return set_id < 0 || id == set_id; };
  size_t failed = 0;
  for (auto it = peer.posted.begin(); it != peer.posted.end();) {
    if (!in_scope(it->message.set_id)) {
      ++it;
      continue;
    }
    handles_.Complete(it->state, status);
    it = peer.posted.erase(it);
    ++failed;
  }
  // A send not written in full yet keeps the caller's buffer until it is, so its failure waits
  // for that (FinishSendsLocked), unless nothing more of it will be written: its peer was lost
  // or the runtime stopped.
  const bool gone = !peer.lost.ok() || !stopped_.ok();
  for (auto it = peer.unsent.begin(); it != peer.unsent.end();) {
    PendingSend& send = *it->second;
    if (!in_scope(send.set_id)) {
      ++it;
      continue;
    }
    if (gone) {
      handles_.Complete(send.state, send.has_deferred ? send.deferred : status);
      it = peer.unsent.erase(it);
      ++failed;
      continue;
    }
    if (!send.has_deferred) {
      send.has_deferred = true;
      send.deferred = status;
      ++failed;
    }
    ++it;
  }
  return failed;
}

Status PointToPoint::LostStatus(int peer_rank, const std::string& what) const {
  return Status::Error(StatusCode::kInternal,
                       "point-to-point on rank " + std::to_string(rank_) +
                           ": lost connection to rank " + std::to_string(peer_rank) +
                           " (it exited, was killed or shut down): " + what);
}

void PointToPoint::LosePeerLocked(int peer_rank, const std::string& what) {
  Peer& peer = peers_[peer_rank];
  if (!stopped_.ok() || !peer.lost.ok()) return;  // already failed with that reason
  peer.lost = LostStatus(peer_rank, what);
  peer.header.reset();
  peer.notices.clear();
  if (peer.incoming.active && peer.incoming.matched) {
    handles_.Complete(peer.incoming.recv.state, peer.lost);
  }
  peer.incoming = Incoming();
  FailPeerLocked(peer_rank, -1, peer.lost);
}

void PointToPoint::Abort(const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stopped_.ok()) return;
  stopped_ = status;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = peers_[peer];
    if (p.incoming.active && p.incoming.matched) handles_.Complete(p.incoming.recv.state, status);
    FailPeerLocked(peer, -1, status);
    // The link's requests go with their buffers: the link itself is aborted by its owner, or
    // writes the rest of what it took before it is.
    p = Peer();
  }
}

void PointToPoint::Progress(double seconds) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!link_ || !stopped_.ok()) return;
    StepLocked();
  }
  try {
    link_->progress(static_cast<int>(std::min(seconds, kProgressSliceSeconds) * 1000));
  } catch (const TransportError&) {
    return;  // the link was aborted: the runtime is stopping, and fails what is pending
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_.ok()) StepLocked();
}

void PointToPoint::StepLocked() {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !peers_[peer].lost.ok()) continue;
    try {
      StepPeerLocked(peer);
    } catch (const TransportError& e) {
      LosePeerLocked(peer, e.what());
    }
  }
}

void PointToPoint::FinishSendsLocked(int peer_rank) {
  Peer& peer = peers_[peer_rank];
  // A send that fails fails alone: what the peer sent before it went may still be read.
  auto written = [&](const std::unique_ptr<Link::Request>& request, Status* error) {
    try {
      return !request || request->test();
    } catch (const TransportError& e) {
      *error = LostStatus(peer_rank, e.what());
      return true;
    }
  };
  for (auto it = peer.unsent.begin(); it != peer.unsent.end();) {
    PendingSend& send = *it->second;
    Status error;
    if (!written(send.head_request, &error) || !written(send.body_request, &error)) {
      ++it;
      continue;
    }
    if (!error.ok()) {
      handles_.Complete(send.state, send.has_deferred ? send.deferred : error);
      it = peer.unsent.erase(it);
      continue;
    }
    // Written: the caller may reuse the buffer (the receiver keeps the message until a receive
    // matches it). A send written in full has succeeded even when the peer's failure notice
    // arrived meanwhile (the peer may have taken it and failed afterwards; the notice fails
    // the later operations), but it carries the rejection of an earlier message, which is
    // reported nowhere else.
    const bool rejection = send.has_deferred && send.deferred.code == StatusCode::kMismatch;
    handles_.Complete(send.state, rejection ? send.deferred : Status::Ok());
    it = peer.unsent.erase(it);
  }
  Status ignored;
  while (!peer.notices.empty() && written(peer.notices.front().head_request, &ignored) &&
         written(peer.notices.front().text_request, &ignored)) {
    peer.notices.pop_front();
  }
}

void PointToPoint::StepPeerLocked(int peer_rank) {
  Peer& peer = peers_[peer_rank];
  FinishSendsLocked(peer_rank);
  // Frames in order: a header, then its payload; the next header only once that is in.
  while (peers_[peer_rank].lost.ok()) {
    if (peer.incoming.active) {
      if (peer.incoming.request && !peer.incoming.request->test()) return;
      FinishIncomingLocked(peer_rank);
      continue;
    }
    if (!peer.header || !peer.header->test()) return;
    std::vector<uint8_t> bytes = peer.header_bytes;
    peer.header = link_->irecv(peer_rank, kHeaderTag, peer.header_bytes.data(), kHeaderBytes);
    OnHeaderLocked(peer_rank, bytes);
  }
}

void PointToPoint::OnHeaderLocked(int peer_rank, const std::vector<uint8_t>& bytes) {
  const std::string from = "a point-to-point frame from rank " + std::to_string(peer_rank);
  Header header;
  std::memcpy(&header, bytes.data(), sizeof(Header));
  if (header.magic != kFrameMagic) throw TransportError(from + " is corrupt", peer_rank);
  if (header.kind == kData) {
    if (!IsValidDataType(header.dtype) || header.ndim < 0 || header.ndim > kMaxDims) {
      throw TransportError(from + " has a bad dtype or rank", peer_rank);
    }
    std::vector<int64_t> shape(header.ndim);
    if (header.ndim > 0) {
      std::memcpy(shape.data(), bytes.data() + sizeof(Header), shape.size() * sizeof(int64_t));
    }
    for (int64_t d : shape) {
      if (d < 0 || d > (int64_t{1} << 48)) throw TransportError(from + " has a bad shape");
    }
    if (NumElements(shape) * DataTypeSize(static_cast<DataType>(header.dtype)) !=
        header.body_bytes) {
      throw TransportError(from + " has a payload that does not match its shape", peer_rank);
    }
    OnDataHeaderLocked(peer_rank, header, std::move(shape));
    return;
  }
  if (header.kind != kReject && header.kind != kFailure) {
    throw TransportError(from + " is of an unknown kind", peer_rank);
  }
  if (header.body_bytes > kMaxTextBytes) throw TransportError(from + " is too long", peer_rank);
  // The text follows as the payload.
  Incoming& in = peers_[peer_rank].incoming;
  in = Incoming();
  in.active = true;
  in.header = header;
  in.text.resize(header.body_bytes);
  if (!in.text.empty()) {
    in.request = link_->irecv(peer_rank, kPayloadTag, in.text.data(), in.text.size());
  }
}

void PointToPoint::OnNoticeLocked(int peer_rank, const Header& header, const std::string& text) {
  Peer& peer = peers_[peer_rank];
  if (header.kind == kFailure) {
    peer.failed_sets[header.set_id] = text;
    FailPeerLocked(peer_rank, header.set_id, Status::Error(StatusCode::kInternal, text));
    return;
  }
  // A message this rank sent did not fit the peer's receive. The send completes once written
  // (the peer has read it); the rejection fails what is pending with the peer in that set, or
  // else the next operation with it, so that this rank raises as well as the receiver. The
  // rejected send itself, when not marked complete yet, is no operation pending.
  std::shared_ptr<PendingSend> rejected;
  auto written = peer.unsent.find(header.sequence);
  if (written != peer.unsent.end()) {
    rejected = written->second;
    peer.unsent.erase(written);
  }
  if (FailPeerLocked(peer_rank, header.set_id, Status::Error(StatusCode::kMismatch, text)) == 0) {
    peer.rejections[header.set_id] = text;
  }
  if (rejected) peer.unsent[header.sequence] = rejected;
}

void PointToPoint::OnDataHeaderLocked(int peer_rank, const Header& header,
                                      std::vector<int64_t> shape) {
  Peer& peer = peers_[peer_rank];
  Incoming& in = peer.incoming;
  in = Incoming();
  in.active = true;
  in.header = header;
  const DataType dtype = static_cast<DataType>(header.dtype);
  for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
    if (it->message.set_id == header.set_id && it->message.tag == header.tag) {
      in.recv = std::move(*it);
      peer.posted.erase(it);
      in.matched = true;
      break;
    }
  }
  uint8_t* into = nullptr;
  if (in.matched) {
    // Straight into the receive's buffer; nothing else completes it meanwhile, since it left
    // the posted list.
    in.problem = ProblemLocked(peer_rank, in.recv, dtype, shape);
    if (!in.problem.empty()) {
      in.scratch.resize(header.body_bytes);
      into = in.scratch.data();
    } else if (in.recv.data != nullptr) {
      into = static_cast<uint8_t*>(in.recv.data);
    } else {
      in.recv.state->output.resize(header.body_bytes);
      in.recv.state->output_shape = shape;
      in.recv.state->integers = {static_cast<int64_t>(dtype)};
      into = in.recv.state->output.data();
    }
  } else {
    in.arrived.set_id = header.set_id;
    in.arrived.tag = header.tag;
    in.arrived.dtype = dtype;
    in.arrived.shape = std::move(shape);
    in.arrived.sequence = header.sequence;
    in.arrived.bytes.resize(header.body_bytes);
    into = in.arrived.bytes.data();
  }
  if (header.body_bytes > 0) {
    in.request = link_->irecv(peer_rank, kPayloadTag, into, header.body_bytes);
  }
}

void PointToPoint::FinishIncomingLocked(int peer_rank) {
  Peer& peer = peers_[peer_rank];
  Incoming in = std::move(peer.incoming);
  peer.incoming = Incoming();
  if (in.header.kind != kData) {
    OnNoticeLocked(peer_rank, in.header, in.text);
    return;
  }
  if (in.matched) {
    handles_.Complete(in.recv.state, in.problem.empty()
                                         ? Status::Ok()
                                         : Status::Error(StatusCode::kMismatch, in.problem));
    if (!in.problem.empty()) {
      SendNoticeLocked(peer_rank, kReject, in.header.set_id, in.header.sequence, in.problem);
    }
    return;
  }
  // A receive posted while the payload was read did not find it among the arrived ones.
  for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
    if (it->message.set_id == in.arrived.set_id && it->message.tag == in.arrived.tag) {
      PostedRecv late = std::move(*it);
      peer.posted.erase(it);
      DeliverLocked(peer_rank, late, in.arrived);
      return;
    }
  }
  peer.arrived.push_back(std::move(in.arrived));
}

}  // namespace horovodlike
