// Client of the launcher's key-value rendezvous server (horovodlike/runner/rendezvous.py).
// Line protocol: "AUTH <secret>" -> "OK"; "PUT <key> <value>" -> "OK";
// "GET <key> <timeout_ms>" -> "VALUE <value>" or "TIMEOUT".
#pragma once

#include <chrono>
#include <string>

namespace horovodlike {

class RendezvousClient {
 public:
  RendezvousClient(const std::string& host, int port, const std::string& secret,
                   std::chrono::steady_clock::time_point deadline);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  void Put(const std::string& key, const std::string& value);
  // Returns false when the key was not set before the deadline.
  bool Get(const std::string& key, std::string* value);

 private:
  std::string Call(const std::string& line);
  int fd_ = -1;
  std::string host_;
  std::chrono::steady_clock::time_point deadline_;
  std::string pending_;  // bytes read past the last line
};

}  // namespace horovodlike
