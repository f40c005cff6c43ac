#include "per_peer_link.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "../common/env_config.h"
#include "../common/logging.h"
#include "tcp/tcp_link.h"

namespace horovodlike {
namespace {

constexpr uint32_t kMaxIdentityBytes = 512;

// Ranks share memory when the launcher placed them on the same host (HOROVOD_HOSTNAME: the
// layout the user gave, which local_rank/cross_rank follow too) and they really can: the same
// kernel (boot id), the same /dev/shm (device and inode of the mount), the same host name.
std::string HostIdentity(const std::string& launcher_host) {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st {};
  if (boot_id.empty() || ::stat("/dev/shm", &st) != 0) return "";
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return launcher_host + "/" + boot_id + "/" +
         std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + "/" + host;
}

}  // namespace

std::unique_ptr<ShmLink> ConnectHostSharedMemory(Link& tcp, const Config& config,
                                                 int generation) {
  const int size = tcp.size(), me = tcp.rank();
  // Every rank tells every other its host identity (empty: shared memory disabled here).
  const std::string mine = config.shm_disabled ? "" : HostIdentity(config.launcher_hostname);
  const uint32_t length = static_cast<uint32_t>(std::min<size_t>(mine.size(), kMaxIdentityBytes));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == me) continue;
    tcp.send(peer, &length, sizeof(length));
    if (length > 0) tcp.send(peer, mine.data(), length);
  }
  std::vector<int> group;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == me) {
      group.push_back(me);
      continue;
    }
    uint32_t n = 0;
    tcp.recv(peer, &n, sizeof(n));
    if (n > kMaxIdentityBytes) throw TransportError("bad host identity from rank " + std::to_string(peer));
    std::string theirs(n, '\0');
    if (n > 0) tcp.recv(peer, theirs.data(), n);
    if (!mine.empty() && theirs == mine) group.push_back(peer);
  }
  if (group.size() < 2) return nullptr;
  ShmLink::Options options;
  options.secret = config.secret_key;
  options.generation = generation;
  options.peer_timeout_seconds = config.peer_timeout_seconds;
  options.channel_bytes = config.shm_channel_bytes;
  options.chunk_bytes = config.shm_chunk_bytes;
  options.small_bytes = config.shm_small_bytes;
  options.spin_us = config.shm_spin_us;
  options.spin_given = config.shm_spin_given;
  options.yield_us = config.shm_yield_us;
  options.stream_stores = config.shm_stream_stores;
  std::unique_ptr<ShmLink> shm = ShmLink::Connect(tcp, group, options);
  if (shm) {
    HVDL_LOG(kDebug, "shared memory with ranks on this host: " << shm->size() << " of " << size);
  }
  return shm;
}

void ProgressTaggedOnBoth(ShmLink* shm, Link& tcp, int timeout_ms) {
  if (!shm) return tcp.progress(timeout_ms);
  if (shm->size() == tcp.size()) return shm->progress(timeout_ms);
  // Peers on both: a sleep in poll() on the TCP connections does not see the host's peers'
  // traffic, so they ring this process's poll bell while it sleeps there (shm_bell.h); the
  // sleep stays short, for a ring that could not be sent.
  shm->progress(0);
  const int bell = shm->PollBell();
  if (bell < 0) {
    tcp.progress(std::min(timeout_ms, 1));
  } else {
    shm->SetPolling(true);
    if (!shm->TaggedWorkWaiting()) tcp.progress_or_readable(std::min(timeout_ms, 1), bell);
    shm->SetPolling(false);
  }
  shm->progress(0);
}

const char* TaggedCarrier(const ShmLink* shm, const Link& tcp) {
  if (!shm) return tcp.tagged_name();
  return shm->size() == tcp.size() ? "shm" : "shm+tcp";
}

std::unique_ptr<Link> PerPeerLink::Connect(const Config& config, int generation) {
  // Set-up runs under the peer timeout: a peer stopped while the ranks exchange their hosts
  // and shared-memory segments must fail the others, not hold them.
  std::unique_ptr<Link> tcp = TcpLink::Connect(config, generation);
  if (tcp->size() == 1) return tcp;
  std::unique_ptr<ShmLink> shm = ConnectHostSharedMemory(*tcp, config, generation);
  // Every rank takes part, with or without shared memory: each learns every host's ranks.
  std::unique_ptr<HostHierarchy> hierarchy = HostHierarchy::Build(
      *tcp, shm.get(), {config.hierarchical_allreduce, config.hierarchical_allgather});
  if (!shm && !hierarchy) return tcp;
  return std::unique_ptr<Link>(
      new PerPeerLink(std::move(tcp), std::move(shm), std::move(hierarchy)));
}

PerPeerLink::PerPeerLink(std::unique_ptr<Link> tcp, std::unique_ptr<ShmLink> shm,
                         std::unique_ptr<HostHierarchy> hierarchy)
    : tcp_(std::move(tcp)), shm_(std::move(shm)), local_(tcp_->size(), -1),
      hierarchy_(std::move(hierarchy)) {
  if (!shm_) return;
  for (int i = 0; i < shm_->size(); ++i) local_[shm_->members()[i]] = i;
}

PerPeerLink::~PerPeerLink() {
  {
    std::lock_guard<std::mutex> lock(sender_mutex_);
    sender_stop_ = true;
  }
  sender_cv_.notify_all();
  if (sender_.joinable()) sender_.join();
}

const char* PerPeerLink::name() const {
  if (!shm_) return tcp_->name();
  return shm_->size() == size() ? "shm" : "shm+tcp";
}

Link& PerPeerLink::Route(int peer, int* routed) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
  if (local_[peer] >= 0) {  // never with no shared memory: local_ is all -1 then
    *routed = local_[peer];
    return *shm_;
  }
  *routed = peer;
  return *tcp_;
}

void PerPeerLink::send(int peer, const void* buf, size_t n) {
  int routed;
  Link& t = Route(peer, &routed);
  t.send(routed, buf, n);
}

void PerPeerLink::recv(int peer, void* buf, size_t n) {
  int routed;
  Link& t = Route(peer, &routed);
  t.recv(routed, buf, n);
}

std::unique_ptr<Link::Request> PerPeerLink::isend(int peer, int tag, const void* buf, size_t n) {
  int routed;
  Link& t = Route(peer, &routed);
  return t.isend(routed, tag, buf, n);
}

std::unique_ptr<Link::Request> PerPeerLink::irecv(int peer, int tag, void* buf, size_t n) {
  int routed;
  Link& t = Route(peer, &routed);
  return t.irecv(routed, tag, buf, n);
}

void PerPeerLink::progress(int timeout_ms) { ProgressTaggedOnBoth(shm_.get(), *tcp_, timeout_ms); }

const char* PerPeerLink::tagged_name() const { return TaggedCarrier(shm_.get(), *tcp_); }

void PerPeerLink::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                           size_t rn) {
  if (sn == 0 && rn == 0) return;
  if (sn == 0) return recv(from, rbuf, rn);
  if (rn == 0) return send(to, sbuf, sn);
  int routed_to, routed_from;
  Link& st = Route(to, &routed_to);
  Link& rt = Route(from, &routed_from);
  if (&st == &rt) return st.sendrecv(routed_to, sbuf, sn, routed_from, rbuf, rn);
  MixedSendRecv(st, routed_to, sbuf, sn, rt, routed_from, rbuf, rn);
}

void PerPeerLink::SenderLoop() {
  std::unique_lock<std::mutex> lock(sender_mutex_);
  while (true) {
    sender_cv_.wait(lock, [&] { return sender_stop_ || job_.pending; });
    if (sender_stop_) return;
    SendJob job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      job.link->send(job.peer, job.buf, job.n);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job_.pending = false;
    job_.done = true;
    job_.error = error;
    sender_cv_.notify_all();
  }
}

void PerPeerLink::MixedSendRecv(Link& st, int to, const void* sbuf, size_t sn, Link& rt,
                                int from, void* rbuf, size_t rn) {
  {
    std::lock_guard<std::mutex> lock(sender_mutex_);
    if (!sender_.joinable()) sender_ = std::thread([this] { SenderLoop(); });
    job_.link = &st;
    job_.peer = to;
    job_.buf = sbuf;
    job_.n = sn;
    job_.pending = true;
    job_.done = false;
    job_.error = nullptr;
  }
  sender_cv_.notify_all();
  std::exception_ptr error;
  try {
    rt.recv(from, rbuf, rn);
  } catch (...) {
    error = std::current_exception();
    abort();  // unblocks the sender, whose buffer must outlive it
  }
  std::unique_lock<std::mutex> lock(sender_mutex_);
  sender_cv_.wait(lock, [&] { return job_.done; });
  if (!error) error = job_.error;
  if (error) std::rethrow_exception(error);
}

void PerPeerLink::abort() {
  if (shm_) shm_->abort();
  tcp_->abort();
}

}  // namespace horovodlike
