#include "gloo_link.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <sys/socket.h>

#include <cstring>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/logging.h"
#include "gloo_hangup_watcher.h"
#include "../per_peer_link.h"
#include "gloo_store.h"
#include "../rendezvous_client.h"
#include "../tcp/tcp_link.h"
#include "../tcp/socket_util.h"

namespace horovodlike {
namespace {

// Every point-to-point message travels in this slot; Gloo's own collectives use slots with
// the prefixes 0x01-0x08 in the top byte, so this one never meets theirs.
constexpr uint64_t kPointToPointSlot = uint64_t{0x48} << 56;
// Data sent inside a frame's header message: small messages (the negotiation's) then take one
// Gloo message, not two.
constexpr size_t kInlineBytes = 32 << 10;

std::chrono::milliseconds Milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

std::unique_ptr<GlooLink> GlooLink::Connect(const Config& config, int generation) {
  const auto peer_timeout = Milliseconds(config.gloo_timeout_seconds);
  if (config.size == 1) {
    if (!config.rendezvous_addr.empty() && config.rendezvous_port > 0) {
      // Nobody to connect to, but the launcher waits for this rank to say it joined.
      RendezvousClient client(config.rendezvous_addr, config.rendezvous_port, config.secret_key,
                              std::chrono::steady_clock::now() +
                                  Milliseconds(config.start_timeout_seconds));
      client.Put("addr/" + std::to_string(generation) + "/0", "local");
    }
    return std::unique_ptr<GlooLink>(new GlooLink(0, 1, nullptr, peer_timeout, nullptr, nullptr));
  }
  if (config.rendezvous_addr.empty() || config.rendezvous_port <= 0) {
    throw InvalidArgument("HOROVOD_SIZE=" + std::to_string(config.size) +
                          " but no rendezvous server is set (HOROVOD_RENDEZVOUS_ADDR/PORT); "
                          "start the job with horovodlikerun --gloo");
  }
  const auto start_timeout = Milliseconds(config.start_timeout_seconds);
  const std::string address = config.network_interface.empty()
      ? LocalAddressToward(config.rendezvous_addr, config.rendezvous_port)
      : InterfaceAddress(config.network_interface);
  // Gloo's pairs do not report a peer that closed its connection: a TCP mesh of our own, on
  // which nothing is sent, tells the watcher when a peer's process is gone or aborted. Its
  // connect also publishes this rank's address, which the launcher counts as joined.
  std::unique_ptr<TcpLink> liveness = TcpLink::Connect(config, generation);
  try {
    gloo::transport::tcp::attr attr(address.c_str());
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.size);
    context->setTimeout(start_timeout);
    RendezvousClient client(config.rendezvous_addr, config.rendezvous_port, config.secret_key,
                            std::chrono::steady_clock::now() + start_timeout);
    GlooRendezvousStore store(client, "gloo/" + std::to_string(generation) + "/");
    context->connectFullMesh(store, device);
    context->setTimeout(peer_timeout);
    // Tagged messages between ranks of this host go through their shared memory.
    std::unique_ptr<ShmLink> shm = ConnectHostSharedMemory(*liveness, config, generation);
    return std::unique_ptr<GlooLink>(new GlooLink(config.rank, config.size, std::move(context),
                                                  peer_timeout, std::move(liveness),
                                                  std::move(shm)));
  } catch (const TransportError&) {
    throw;
  } catch (const InvalidArgument&) {
    throw;
  } catch (const std::exception& e) {  // gloo::Exception, gloo::EnforceNotMet, system_error
    throw TransportError(std::string("Gloo could not connect the ranks: ") + e.what());
  }
}

GlooLink::GlooLink(int rank, int size, std::shared_ptr<gloo::Context> context,
                   std::chrono::milliseconds timeout, std::unique_ptr<TcpLink> liveness,
                   std::unique_ptr<ShmLink> shm)
    : rank_(rank), size_(size), context_(std::move(context)), timeout_(timeout),
      lost_(static_cast<size_t>(size)), inbox_(static_cast<size_t>(size)),
      liveness_(std::move(liveness)), shm_(std::move(shm)), local_(static_cast<size_t>(size), -1) {
  if (shm_) {
    for (int i = 0; i < shm_->size(); ++i) local_[shm_->members()[i]] = i;
  }
  if (liveness_) {
    std::vector<int> sockets(static_cast<size_t>(size), -1);
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) sockets[peer] = liveness_->socket(peer);
    }
    watcher_ = std::make_unique<GlooHangupWatcher>(std::move(sockets),
                                                   [this](int peer) { OnHangup(peer); });
  }
}

GlooLink::~GlooLink() {
  watcher_.reset();  // before the pairs it watches go
}

void GlooLink::OnHangup(int peer) {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  lost_[peer] = "rank " + std::to_string(peer) +
                " closed the connection (it exited, was killed, or stopped after an error)";
  for (const Pending& p : pending_) {
    if (p.peer != peer) continue;
    if (p.send) {
      p.buffer->abortWaitSend();
    } else {
      p.buffer->abortWaitRecv();
    }
  }
}

void GlooLink::abort() {
  if (aborted_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (const Pending& p : pending_) {
      if (p.send) {
        p.buffer->abortWaitSend();
      } else {
        p.buffer->abortWaitRecv();
      }
    }
  }
  // The peers' watchers see the liveness connections close.
  if (shm_) shm_->abort();
  if (liveness_) liveness_->abort();
  if (context_) context_->closeConnections();
}

void GlooLink::CheckUsable(int peer) {
  if (aborted_) throw TransportError("the link was shut down");
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
  std::string lost;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    lost = lost_[peer];
  }
  if (!lost.empty()) {
    Fail("lost connection to rank " + std::to_string(peer) + ": " + lost, peer,
         TransportError::Cause::kPeerLost);
  }
}

void GlooLink::Fail(const std::string& what, int peer, TransportError::Cause cause) {
  if (aborted_) throw TransportError("the link was shut down");
  // Gloo leaves a pair in an unknown state after an I/O error; nothing more goes over it.
  abort();
  throw TransportError(what, peer, cause);
}

std::unique_ptr<gloo::transport::UnboundBuffer> GlooLink::Post(bool send, int peer,
                                                                     void* data, size_t n) {
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  try {
    buffer = context_->createUnboundBuffer(data, n);
    if (send) {
      buffer->send(peer, kPointToPointSlot);
    } else {
      buffer->recv(peer, kPointToPointSlot);
    }
  } catch (const std::exception& e) {  // a pair that failed already
    ForgetPending();  // the caller's other transfers end with this exception
    Fail("lost connection to rank " + std::to_string(peer) + ": " + e.what(), peer,
         TransportError::Cause::kPeerLost);
  }
  std::lock_guard<std::mutex> lock(pending_mutex_);
  // Registered before any wait, so that a hang-up or abort from now on wakes that wait.
  pending_.push_back({buffer.get(), peer, send});
  return buffer;
}

void GlooLink::Await(std::unique_ptr<gloo::transport::UnboundBuffer>& buffer, bool send,
                          int peer) {
  bool completed = false, timed_out = false;
  std::string why;
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    completed = !aborted_ && lost_[peer].empty();
  }
  try {
    if (completed) completed = send ? buffer->waitSend(timeout_) : buffer->waitRecv(timeout_);
  } catch (const std::exception& e) {  // Gloo's I/O errors, timeouts and failed checks
    completed = false;
    timed_out = std::chrono::steady_clock::now() - start >= timeout_;
    why = timed_out ? "no progress for " + std::to_string(timeout_.count() / 1000) +
                          " s (HOROVOD_GLOO_TIMEOUT_SECONDS, by default "
                          "HOROVOD_PEER_TIMEOUT_SECONDS); the peer is stopped or unreachable"
                    : e.what();
  }
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->buffer == buffer.get()) {
        pending_.erase(it);
        break;
      }
    }
    if (!completed && why.empty()) why = lost_[peer];  // woken by the watcher, or abort()
  }
  if (completed) return;
  ForgetPending();
  if (aborted_ || why.empty()) throw TransportError("the link was shut down");
  Fail("lost connection to rank " + std::to_string(peer) + ": " + why, peer,
       timed_out ? TransportError::Cause::kPeerTimeout : TransportError::Cause::kPeerLost);
}

void GlooLink::ForgetPending() {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  pending_.clear();
}

void GlooLink::TakeFromInbox(int peer, char*& rp, size_t& rn) {
  Inbox& inbox = inbox_[peer];
  const size_t n = std::min(rn, inbox.bytes.size() - inbox.offset);
  if (n == 0) return;
  std::memcpy(rp, inbox.bytes.data() + inbox.offset, n);
  inbox.offset += n;
  rp += n;
  rn -= n;
}

void GlooLink::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                             size_t rn) {
  if (sn > 0) CheckUsable(to);
  if (rn > 0) CheckUsable(from);
  if (sn == 0 && rn == 0) return;
  // A byte stream, as over TCP: the sender's calls need not match the receiver's. Gloo tells a
  // receiver nothing about a message's size, so each send is a frame: a header message with
  // the length and up to kInlineBytes of data, then the rest as one message. Bytes of a frame
  // beyond what a receive wants wait in the peer's inbox for the next one.
  std::unique_ptr<gloo::transport::UnboundBuffer> header_out, payload_out;
  if (sn > 0) {
    const uint64_t length = sn;
    const size_t inline_bytes = std::min(sn, kInlineBytes);
    send_header_.resize(sizeof(length) + inline_bytes);
    std::memcpy(send_header_.data(), &length, sizeof(length));
    std::memcpy(send_header_.data() + sizeof(length), sbuf, inline_bytes);
    header_out = Post(true, to, send_header_.data(), send_header_.size());
    if (sn > inline_bytes) {
      payload_out = Post(true, to, const_cast<char*>(static_cast<const char*>(sbuf)) +
                                       inline_bytes, sn - inline_bytes);
    }
  }
  auto* rp = static_cast<char*>(rbuf);
  while (rn > 0) {
    TakeFromInbox(from, rp, rn);
    if (rn == 0) break;
    Inbox& inbox = inbox_[from];
    if (inbox.payload_left > 0) {
      // The rest of a frame: straight into place when it fits.
      const size_t n = inbox.payload_left;
      inbox.payload_left = 0;
      const bool fits = n <= rn;
      if (!fits) {
        inbox.bytes.resize(n);
        inbox.offset = 0;
      }
      auto in = Post(false, from, fits ? rp : inbox.bytes.data(), n);
      Await(in, false, from);
      if (fits) {
        rp += n;
        rn -= n;
      }
      continue;
    }
    recv_header_.resize(sizeof(uint64_t) + kInlineBytes);
    auto in = Post(false, from, recv_header_.data(), recv_header_.size());
    Await(in, false, from);
    uint64_t length = 0;
    std::memcpy(&length, recv_header_.data(), sizeof(length));
    const size_t inline_bytes = std::min<size_t>(length, kInlineBytes);
    inbox.bytes.assign(recv_header_.begin() + sizeof(length),
                       recv_header_.begin() + sizeof(length) + inline_bytes);
    inbox.offset = 0;
    inbox.payload_left = length - inline_bytes;
  }
  if (header_out) Await(header_out, true, to);
  if (payload_out) Await(payload_out, true, to);
}

std::unique_ptr<Link::Request> GlooLink::isend(int peer, int tag, const void* buf, size_t n) {
  if (!liveness_) return Link::isend(peer, tag, buf, n);
  if (Local(peer) >= 0) return shm_->isend(Local(peer), tag, buf, n);
  return liveness_->isend(peer, tag, buf, n);
}

std::unique_ptr<Link::Request> GlooLink::irecv(int peer, int tag, void* buf, size_t n) {
  if (!liveness_) return Link::irecv(peer, tag, buf, n);
  if (Local(peer) >= 0) return shm_->irecv(Local(peer), tag, buf, n);
  return liveness_->irecv(peer, tag, buf, n);
}

int GlooLink::Local(int peer) const {
  return peer >= 0 && peer < size_ ? local_[static_cast<size_t>(peer)] : -1;
}

void GlooLink::progress(int timeout_ms) {
  if (!liveness_) return Link::progress(timeout_ms);
  ProgressTaggedOnBoth(shm_.get(), *liveness_, timeout_ms);
}

const char* GlooLink::tagged_name() const {
  return liveness_ ? TaggedCarrier(shm_.get(), *liveness_) : "tcp";
}

}  // namespace horovodlike
