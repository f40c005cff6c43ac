// Client of the launcher's key-value rendezvous server (horovodlike/runner/rendezvous.py, which
// documents the protocol). Line protocol:
//   server, on connect:        HELLO <server_nonce>
//   client:                    AUTH <client_nonce> <client_proof>
//   server:                    OK <server_proof> | ERROR bad secret
//   "PUT <key> <value>" -> "OK";  "GET <key> <timeout_ms>" -> "VALUE <value>" | "TIMEOUT";
//   once the launcher stops the job: a GET of a key not set -> "ABORTED <why>", and the server
//   sends "ABORT <why>" unasked (once) to each client connected by then.
// Nonces are 32 random bytes, proofs HMAC-SHA256(secret, server_nonce || client_nonce ||
// "horovodlike rendezvous client" | "... server"), all in hex: both sides show they know the
// job's secret and the secret never crosses the wire.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace horovodlike {

struct Config;

class RendezvousClient {
 public:
  // Connects (retrying until the deadline when `retry`) and authenticates, connecting again
  // when the server drops the connection unanswered (it sheds silent connections under a
  // flood); throws TransportError when the server is unreachable, refuses the secret or cannot
  // prove its own.
  RendezvousClient(const std::string& host, int port, const std::string& secret,
                   std::chrono::steady_clock::time_point deadline, bool retry = true);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  void Put(const std::string& key, const std::string& value);
  // Returns false when the key was not set before the deadline (or within timeout_ms, if given).
  bool Get(const std::string& key, std::string* value, int64_t timeout_ms = -1);
  // Between requests: throws TransportError when the launcher has stopped the job (or has
  // gone). Poll fd() for POLLIN to wait for that alongside other sockets.
  void ThrowIfAborted();
  int fd() const { return fd_; }

 private:
  std::string Call(const std::string& line);
  std::string ReadLine(std::chrono::steady_clock::time_point deadline);
  void Authenticate(const std::string& secret);
  int fd_ = -1;
  std::string host_;
  std::chrono::steady_clock::time_point deadline_;
  std::string pending_;  // bytes read past the last line
  bool closed_ = false;  // the server closed the connection
};

// Why a rank's runtime stopped: `origin` is the job rank that caused it (this rank's own when it
// failed by itself, -1 when unknown), `kind` one of lost, timeout, shutdown, stall, error.
struct FailureReport {
  int origin = -1;
  std::string kind;
  std::string reason;
};

// Tells the launcher why this rank's runtime stopped: PUT failure/<generation>/<rank> =
// "<origin>:<kind>:<reason, %-escaped>". The launcher uses it to name the rank that failed first
// in cause. When the origin had itself reported a failure caused by another rank (this rank lost
// its connection to a rank that had lost its own to a third), the report names that rank
// instead and tells both reasons; the report as sent is returned. Best effort: without a
// rendezvous server, or when it cannot be reached within a few seconds, nothing is sent.
FailureReport ReportFailureToLauncher(const Config& config, int generation, FailureReport report);

}  // namespace horovodlike
