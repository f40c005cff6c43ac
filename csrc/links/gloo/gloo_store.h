// Gloo's rendezvous store over the launcher's key-value server, so that a Gloo job needs
// nothing beyond what horovodlikerun already runs (no Redis, no shared file system).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "../rendezvous_client.h"

namespace horovodlike {

class GlooRendezvousStore : public gloo::rendezvous::Store {
 public:
  // Every key is stored under `prefix` (the init generation, so a re-init never reads the
  // previous one's addresses). `client` must outlive the store.
  GlooRendezvousStore(RendezvousClient& client, std::string prefix);

  // Values are hex-encoded (the server's protocol is text without spaces) and split over
  // several keys when longer than one protocol line.
  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key until the client's deadline; throws TransportError naming it.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Fetch(const std::string& key);
  RendezvousClient& client_;
  std::string prefix_;
};

}  // namespace horovodlike
