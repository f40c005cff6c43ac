#include "tagged_inbox.h"

#include <cstring>

namespace horovodlike {
namespace {

std::string SizeMismatch(uint64_t bytes, int who, size_t n) {
  return "a tagged message of " + std::to_string(bytes) + " bytes from rank " +
         std::to_string(who) + " for a receive of " + std::to_string(n) + " bytes";
}

}  // namespace

std::shared_ptr<TaggedOp> TaggedOp::Make(int peer, int tag, const void* sbuf, void* rbuf,
                                         size_t n) {
  auto op = std::make_shared<TaggedOp>();
  op->peer = peer;
  op->tag = tag;
  op->sbuf = static_cast<const uint8_t*>(sbuf);
  op->rbuf = static_cast<uint8_t*>(rbuf);
  op->n = n;
  return op;
}

void TaggedOp::Fail(const std::string& what, int who, TransportError::Cause why) {
  if (finished()) return;
  error = what;
  error_peer = who;
  cause = why;
  failed.store(true, std::memory_order_release);
}

bool TaggedOp::Check() const {
  if (failed.load(std::memory_order_acquire)) throw TransportError(error, error_peer, cause);
  return done.load(std::memory_order_acquire);
}

void TaggedInbox::Post(const std::shared_ptr<TaggedOp>& op, int who) {
  auto kept = unexpected_.find(op->tag);
  if (kept == unexpected_.end() || kept->second.empty()) {
    posted_[op->tag].push_back(op);
    return;
  }
  // Arrived already (also from a peer lost since: what it sent before is still delivered).
  std::vector<uint8_t> message = std::move(kept->second.front());
  kept->second.pop_front();
  if (message.size() != op->n) {
    op->Fail(SizeMismatch(message.size(), who, op->n), who, TransportError::Cause::kOther);
    return;
  }
  if (op->n > 0) std::memcpy(op->rbuf, message.data(), op->n);
  op->Complete();
}

void TaggedInbox::Start(int tag, uint64_t bytes) {
  reading_ = true;
  tag_ = tag;
  bytes_ = bytes;
  got_ = 0;
  target_.reset();
  auto posted = posted_.find(tag);
  if (posted != posted_.end() && !posted->second.empty()) {
    target_ = posted->second.front();
    posted->second.pop_front();
  }
  if (target_ && target_->n == bytes) {
    dest_ = target_->rbuf;
  } else {
    stash_.assign(bytes, 0);  // kept for a later receive, or read to report a mismatch
    dest_ = stash_.data();
  }
}

bool TaggedInbox::Finish(int who) {
  reading_ = false;
  if (!target_) {
    // A receive posted while the message was being read gets it now (messages of a tag
    // arrive in order, and this one came before any still to be read).
    auto posted = posted_.find(tag_);
    if (posted == posted_.end() || posted->second.empty()) {
      unexpected_[tag_].push_back(std::move(stash_));
      stash_ = {};
      return false;
    }
    target_ = posted->second.front();
    posted->second.pop_front();
    if (target_->n == bytes_ && bytes_ > 0) std::memcpy(target_->rbuf, stash_.data(), bytes_);
  }
  if (target_->n != bytes_) {
    target_->Fail(SizeMismatch(bytes_, who, target_->n), who, TransportError::Cause::kOther);
  } else {
    target_->Complete();
  }
  target_.reset();
  stash_ = {};
  return true;
}

void TaggedInbox::Cancel(const std::shared_ptr<TaggedOp>& op) {
  auto posted = posted_.find(op->tag);
  if (posted != posted_.end()) {
    auto& line = posted->second;
    for (auto it = line.begin(); it != line.end(); ++it) {
      if (*it == op) {
        line.erase(it);
        return;
      }
    }
  }
  if (target_ != op) return;
  if (dest_ == op->rbuf) {
    stash_.assign(op->rbuf, op->rbuf + got_);
    stash_.resize(bytes_);
    dest_ = stash_.data();
  }
  target_.reset();
}

void TaggedInbox::FailAll(const std::string& why, int who, TransportError::Cause cause) {
  for (auto& [tag, ops] : posted_) {
    for (auto& op : ops) op->Fail(why, who, cause);
  }
  posted_.clear();
  if (target_) target_->Fail(why, who, cause);
  target_.reset();
  reading_ = false;
}

}  // namespace horovodlike
