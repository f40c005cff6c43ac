#include "rendezvous_client.h"

#include <unistd.h>

#include "../core/common.h"
#include "socket_util.h"

namespace horovodlike {

RendezvousClient::RendezvousClient(const std::string& host, int port, const std::string& secret,
                                   std::chrono::steady_clock::time_point deadline)
    : host_(host + ":" + std::to_string(port)), deadline_(deadline) {
  fd_ = ConnectWithRetry(host, port, deadline, "rendezvous server " + host_);
  if (Call("AUTH " + secret) != "OK") {
    throw TransportError("rendezvous server " + host_ +
                         " rejected this job's secret (HOROVOD_SECRET_KEY)");
  }
}

RendezvousClient::~RendezvousClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string RendezvousClient::Call(const std::string& line) {
  std::string out = line + "\n";
  const std::string what = "rendezvous server " + host_;
  WriteAll(fd_, out.data(), out.size(), deadline_, what);
  while (true) {
    auto newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string reply = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      return reply;
    }
    if (pending_.size() > 8192) throw TransportError(what + ": reply line too long");
    char chunk[512];
    // Reads at least one byte, up to what is available.
    size_t got = 0;
    ReadAll(fd_, chunk, 1, deadline_ + std::chrono::hours(24 * 365), what);
    got = 1;
    pending_.append(chunk, got);
  }
}

void RendezvousClient::Put(const std::string& key, const std::string& value) {
  std::string reply = Call("PUT " + key + " " + value);
  if (reply != "OK") throw TransportError("rendezvous PUT " + key + " failed: " + reply);
}

bool RendezvousClient::Get(const std::string& key, std::string* value) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline_ - std::chrono::steady_clock::now());
  long long ms = left.count() > 0 ? left.count() : 0;
  std::string reply = Call("GET " + key + " " + std::to_string(ms));
  if (reply == "TIMEOUT") return false;
  if (reply.rfind("VALUE ", 0) != 0) {
    throw TransportError("rendezvous GET " + key + " failed: " + reply);
  }
  *value = reply.substr(6);
  return true;
}

}  // namespace horovodlike
