#include "gloo_store.h"

#include "../../common/common.h"

namespace horovodlike {
namespace {

// Hex characters per stored piece: well inside the server's 4096-byte line limit.
constexpr size_t kPieceChars = 3000;

std::string ToHex(const std::vector<char>& data) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(data.size() * 2);
  for (char c : data) {
    auto byte = static_cast<unsigned char>(c);
    out += digits[byte >> 4];
    out += digits[byte & 15];
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::vector<char> FromHex(const std::string& hex, const std::string& key) {
  if (hex.size() % 2 != 0) throw TransportError("rendezvous value of '" + key + "' is corrupt");
  std::vector<char> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int high = HexDigit(hex[2 * i]), low = HexDigit(hex[2 * i + 1]);
    if (high < 0 || low < 0) throw TransportError("rendezvous value of '" + key + "' is corrupt");
    out[i] = static_cast<char>((high << 4) | low);
  }
  return out;
}

}  // namespace

GlooRendezvousStore::GlooRendezvousStore(RendezvousClient& client, std::string prefix)
    : client_(client), prefix_(std::move(prefix)) {}

void GlooRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string hex = ToHex(data);
  size_t pieces = 0;
  for (size_t at = 0; at < hex.size(); at += kPieceChars, ++pieces) {
    client_.Put(prefix_ + key + "/" + std::to_string(pieces), hex.substr(at, kPieceChars));
  }
  // The key itself last: whoever sees it finds every piece.
  client_.Put(prefix_ + key, "pieces:" + std::to_string(pieces));
}

std::string GlooRendezvousStore::Fetch(const std::string& key) {
  std::string value;
  if (!client_.Get(prefix_ + key, &value)) {
    // Gloo's keys are the ranks' numbers.
    throw TransportError("Gloo rendezvous: rank " + key +
                         " did not publish its address before the start timeout "
                         "(HOROVOD_START_TIMEOUT)");
  }
  return value;
}

std::vector<char> GlooRendezvousStore::get(const std::string& key) {
  const std::string header = Fetch(key);
  if (header.rfind("pieces:", 0) != 0) {
    throw TransportError("rendezvous value of '" + key + "' is corrupt");
  }
  const size_t pieces = std::stoul(header.substr(7));
  std::string hex;
  for (size_t i = 0; i < pieces; ++i) hex += Fetch(key + "/" + std::to_string(i));
  return FromHex(hex, key);
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) Fetch(key);
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds&) {
  // The client's deadline (the job's start timeout) bounds the wait.
  wait(keys);
}

}  // namespace horovodlike
