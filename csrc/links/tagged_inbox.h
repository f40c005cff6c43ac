// What the links' tagged channels (tcp/tagged_channel.h, shm/shm_tagged.h) share: a request's
// state, the 16-byte header each message starts with, and the receiving side per peer, which
// matches messages to receives by tag in the order sent: the receives posted per tag, the
// messages that arrived before their receive, and the message being read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../common/common.h"

namespace horovodlike {

struct TaggedFrameHeader {
  uint32_t magic = 0;
  int32_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(TaggedFrameHeader) == 16, "wire structs must not be padded");

// Larger messages are taken for a corrupt header.
constexpr uint64_t kMaxTaggedMessageBytes = uint64_t{1} << 48;

// One send or receive. `done` and `failed` may be read without the channel's lock; the error
// fields are written before `failed` is set.
struct TaggedOp {
  int peer = -1;  // the channel's index of the peer
  int tag = 0;
  const uint8_t* sbuf = nullptr;  // a send's payload
  uint8_t* rbuf = nullptr;        // a receive's buffer
  size_t n = 0;
  TaggedFrameHeader header;  // a send's
  size_t written = 0;        // a send's bytes written so far (what counts is the channel's)
  std::atomic<bool> done{false};
  std::atomic<bool> failed{false};
  std::string error;
  int error_peer = -1;
  TransportError::Cause cause = TransportError::Cause::kOther;

  static std::shared_ptr<TaggedOp> Make(int peer, int tag, const void* sbuf, void* rbuf,
                                        size_t n);
  bool finished() const {
    return done.load(std::memory_order_acquire) || failed.load(std::memory_order_acquire);
  }
  void Complete() { done.store(true, std::memory_order_release); }
  void Fail(const std::string& what, int who, TransportError::Cause why);
  // Throws the failure, if any; returns whether the request is complete.
  bool Check() const;
};

class TaggedInbox {
 public:
  // A receive from this peer (`who`, its job rank, names it in errors): takes the first message
  // kept for its tag, or waits in line for the next one.
  void Post(const std::shared_ptr<TaggedOp>& op, int who);
  // The header of the next message was read: where its payload goes (the receive posted for
  // its tag when the size matches, else a buffer of its own).
  void Start(int tag, uint64_t bytes);
  // Whether a message's payload is being read, and how much of it is left.
  bool reading() const { return reading_; }
  uint64_t left() const { return bytes_ - got_; }
  // Where the next payload bytes go; Advance after writing them there.
  uint8_t* dest() const { return dest_ + got_; }
  void Advance(size_t n) { got_ += n; }
  // The payload is all read: hands it to its receive (true: a request completed or failed) or
  // keeps it for a later one (false).
  bool Finish(int who);
  // Fails the receives posted and the one being filled.
  void FailAll(const std::string& why, int who, TransportError::Cause cause);
  // A receive given up before it completed (its request destroyed): it leaves the line, and a
  // message being read into it goes on into a buffer of its own and is kept for a later
  // receive, so that nothing is written into its buffer afterwards.
  void Cancel(const std::shared_ptr<TaggedOp>& op);

 private:
  std::map<int, std::deque<std::shared_ptr<TaggedOp>>> posted_;       // receives per tag
  std::map<int, std::deque<std::vector<uint8_t>>> unexpected_;        // before their receive
  bool reading_ = false;
  int tag_ = 0;
  uint64_t bytes_ = 0, got_ = 0;
  std::shared_ptr<TaggedOp> target_;  // the receive being filled; null: into stash_
  std::vector<uint8_t> stash_;
  uint8_t* dest_ = nullptr;
};

}  // namespace horovodlike
