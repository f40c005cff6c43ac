#include "rendezvous_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "../common/common.h"
#include "../common/env_config.h"
#include "../common/hmac.h"
#include "tcp/socket_util.h"

namespace horovodlike {
namespace {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMaxReplyBytes = 8192;
// The server drops the connections silent longest when too many are authenticating at once
// (strangers flooding its port): one dropped before the server's answer is made this many times.
constexpr int kAuthAttempts = 3;
constexpr char kClientContext[] = "horovodlike rendezvous client";
constexpr char kServerContext[] = "horovodlike rendezvous server";

std::string Proof(const std::string& secret, const uint8_t* server_nonce,
                  const uint8_t* client_nonce, const char* context) {
  std::string message(reinterpret_cast<const char*>(server_nonce), kNonceBytes);
  message.append(reinterpret_cast<const char*>(client_nonce), kNonceBytes);
  message += context;
  Sha256Digest mac = HmacSha256(secret, message);
  return ToHex(mac.data(), mac.size());
}

// Bytes other than printable ASCII, and '%', as %XX: a value must be one whitespace-free field.
std::string Escape(const std::string& text) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (c > 0x20 && c < 0x7f && c != '%') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

std::string Unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      uint8_t byte = 0;
      if (FromHex(text.substr(i + 1, 2), &byte, 1)) {
        out += static_cast<char>(byte);
        i += 2;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

std::string AbortMessage(const std::string& reply) {
  return "the launcher stopped the job: " + reply.substr(reply.find(' ') + 1);
}

}  // namespace

RendezvousClient::RendezvousClient(const std::string& host, int port, const std::string& secret,
                                   std::chrono::steady_clock::time_point deadline, bool retry)
    : host_(host + ":" + std::to_string(port)), deadline_(deadline) {
  const std::string what = "rendezvous server " + host_;
  fd_ = retry ? ConnectWithRetry(host, port, deadline, what)
              : ConnectOnce(host, port, deadline, what);
  for (int attempt = 1;; ++attempt) {
    try {
      Authenticate(secret);
      return;
    } catch (...) {
      ::close(fd_);
      fd_ = -1;
      if (!closed_ || attempt == kAuthAttempts) throw;
    }
    closed_ = false;
    pending_.clear();
    try {
      fd_ = ConnectOnce(host, port, std::chrono::steady_clock::now() + std::chrono::seconds(5),
                        what);
    } catch (const TransportError&) {
      throw TransportError(what + " closed the connection (the launcher has ended)");
    }
  }
}

RendezvousClient::~RendezvousClient() {
  if (fd_ >= 0) ::close(fd_);
}

void RendezvousClient::Authenticate(const std::string& secret) {
  const std::string what = "rendezvous server " + host_;
  // The server speaks first; allow it a few seconds even when the start deadline is near.
  const auto hello_deadline =
      std::max(deadline_, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  std::string hello = ReadLine(hello_deadline);
  uint8_t server_nonce[kNonceBytes], client_nonce[kNonceBytes];
  if (hello.rfind("HELLO ", 0) != 0 || !FromHex(hello.substr(6), server_nonce, kNonceBytes)) {
    throw TransportError(what + " is not a horovodlike rendezvous server of this version "
                         "(it greeted with '" + hello.substr(0, 40) + "')");
  }
  RandomBytes(client_nonce, kNonceBytes);
  std::string line = "AUTH " + ToHex(client_nonce, kNonceBytes) + " " +
                     Proof(secret, server_nonce, client_nonce, kClientContext) + "\n";
  WriteAll(fd_, line.data(), line.size(), hello_deadline, what);
  std::string reply = ReadLine(hello_deadline);
  if (reply.rfind("OK ", 0) != 0) {
    if (reply.rfind("ABORTED ", 0) == 0) throw TransportError(AbortMessage(reply));
    throw TransportError(what + " rejected this job's secret (HOROVOD_SECRET_KEY): " + reply);
  }
  const std::string expected = Proof(secret, server_nonce, client_nonce, kServerContext);
  const std::string got = reply.substr(3);
  if (got.size() != expected.size() ||
      !ConstantTimeEqual(reinterpret_cast<const uint8_t*>(got.data()),
                         reinterpret_cast<const uint8_t*>(expected.data()), expected.size())) {
    throw TransportError(what + " could not prove that it knows this job's secret "
                         "(HOROVOD_SECRET_KEY); it is not this job's launcher");
  }
}

std::string RendezvousClient::ReadLine(std::chrono::steady_clock::time_point deadline) {
  const std::string what = "rendezvous server " + host_;
  while (true) {
    auto newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      return line;
    }
    if (pending_.size() > kMaxReplyBytes) throw TransportError(what + ": reply line too long");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, left > 0 ? static_cast<int>(std::min<int64_t>(left, 1 << 30)) : 0);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) throw TransportError(what + ": no reply in time");
    char chunk[1024];
    ssize_t got = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno == ECONNRESET)) {
      closed_ = true;
      throw TransportError(what + " closed the connection (the launcher has ended)");
    }
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw TransportError(what + ": " + std::strerror(errno));
    }
    pending_.append(chunk, static_cast<size_t>(got));
  }
}

std::string RendezvousClient::Call(const std::string& line) {
  std::string out = line + "\n";
  WriteAll(fd_, out.data(), out.size(), deadline_ + std::chrono::seconds(10),
           "rendezvous server " + host_);
  // A GET waits on the server until the deadline at most; allow for the reply's trip.
  std::string reply = ReadLine(deadline_ + std::chrono::seconds(10));
  // The server's notice that the job is stopping ("ABORT <why>", unasked, at most once) may come
  // before the reply; requests still get their own answers.
  if (reply.rfind("ABORT ", 0) == 0) reply = ReadLine(deadline_ + std::chrono::seconds(10));
  if (reply.rfind("ABORTED ", 0) == 0) throw TransportError(AbortMessage(reply));
  return reply;
}

void RendezvousClient::ThrowIfAborted() {
  pollfd p{fd_, POLLIN, 0};
  if (pending_.empty() && ::poll(&p, 1, 0) <= 0) return;
  std::string line = ReadLine(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  if (line.rfind("ABORT ", 0) == 0 || line.rfind("ABORTED ", 0) == 0) {
    throw TransportError(AbortMessage(line));
  }
  throw TransportError("rendezvous server " + host_ + " sent an unexpected line: " +
                       line.substr(0, 80));
}

void RendezvousClient::Put(const std::string& key, const std::string& value) {
  std::string reply = Call("PUT " + key + " " + value);
  if (reply != "OK") throw TransportError("rendezvous PUT " + key + " failed: " + reply);
}

bool RendezvousClient::Get(const std::string& key, std::string* value, int64_t timeout_ms) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline_ - std::chrono::steady_clock::now());
  long long ms = left.count() > 0 ? left.count() : 0;
  if (timeout_ms >= 0) ms = std::min<long long>(ms, timeout_ms);
  std::string reply = Call("GET " + key + " " + std::to_string(ms));
  if (reply == "TIMEOUT") return false;
  if (reply.rfind("VALUE ", 0) != 0) {
    throw TransportError("rendezvous GET " + key + " failed: " + reply);
  }
  *value = reply.substr(6);
  return true;
}

FailureReport ReportFailureToLauncher(const Config& config, int generation,
                                      FailureReport report) {
  if (config.rendezvous_addr.empty() || config.rendezvous_port <= 0) return report;
  const std::string prefix = "failure/" + std::to_string(generation) + "/";
  try {
    RendezvousClient client(config.rendezvous_addr, config.rendezvous_port, config.secret_key,
                            std::chrono::steady_clock::now() + std::chrono::seconds(3),
                            /*retry=*/false);
    std::string theirs;
    // A peer reports before it closes its connections, so its report, if any, is there now: a
    // GET with no wait. A silent peer may itself be waiting on another and give up at about
    // the same moment: its report is worth a second's wait.
    if (report.origin >= 0 && report.origin != config.rank) {
      try {
        client.Get(prefix + std::to_string(report.origin), &theirs,
                   report.kind == "timeout" ? 1000 : 0);
      } catch (const TransportError&) {
        // No report from it ("ABORTED" once the launcher is stopping the job): ours alone.
      }
    }
    const auto first = theirs.find(':'), second = theirs.find(':', first + 1);
    if (first != std::string::npos && second != std::string::npos) {
      const int their_origin = std::atoi(theirs.substr(0, first).c_str());
      if (their_origin >= 0 && their_origin != report.origin && their_origin != config.rank) {
        report.reason += "; rank " + std::to_string(report.origin) + " had failed first: " +
                         Unescape(theirs.substr(second + 1));
        report.origin = their_origin;
      }
    }
    client.Put(prefix + std::to_string(config.rank), std::to_string(report.origin) + ":" +
                                                          report.kind + ":" +
                                                          Escape(report.reason.substr(0, 1000)));
  } catch (const std::exception&) {
    // The launcher is gone or stopping the job already; nobody is left to tell.
  }
  return report;
}

}  // namespace horovodlike
