// A process set's view of the job's link: ranks numbered within the set, messages
// carried by the parent's connections.
#pragma once

#include <vector>

#include "link.h"

namespace horovodlike {

class SubsetLink : public Link {
 public:
  // `members`: global ranks of the set, ascending; this rank must be one of them.
  SubsetLink(Link& parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  void send(int peer, const void* buf, size_t n) override;
  void recv(int peer, void* buf, size_t n) override;
  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  void abort() override { parent_.abort(); }
  const char* name() const override { return parent_.name(); }
  bool interruptible() const override { return parent_.interruptible(); }

 private:
  int Global(int peer) const;
  Link& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace horovodlike
