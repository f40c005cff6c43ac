#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <string>

#include "../../common/interrupt.h"
#include "mpi_link.h"

namespace horovodlike {

// --- tagged messages ------------------------------------------------------------------------

// One MPI request on the tagged communicator. Tested under the link's tagged_mutex_ only: MPI
// forbids two threads testing one request at once, and progress() tests them all.
class MpiLink::MpiRequest : public Link::Request {
 public:
  MpiRequest(MpiLink& link, int peer, size_t n) : link_(link), peer_(peer), n_(n) {}
  ~MpiRequest() override {
    std::lock_guard<std::mutex> lock(link_.tagged_mutex_);
    auto& all = link_.in_flight_;
    all.erase(std::remove(all.begin(), all.end(), this), all.end());
    if (request_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&request_);  // an unfinished transfer given up on (its link was aborted)
      MPI_Request_free(&request_);
    }
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(link_.tagged_mutex_);
    TestLocked();
    return Check();
  }
  void wait() override {
    auto since = Clock::now();
    while (!test()) {
      const auto idle = Clock::now() - since;
      if (idle >= kInterruptAfter && InterruptRequested()) {
        Fail(InterruptedWaitMessage(peer_), TransportError::Cause::kInterrupted);
      }
      if (idle > std::chrono::milliseconds(link_.timeout_ms_)) {
        Fail("no progress from rank " + std::to_string(peer_) + " in a tagged message for " +
                 std::to_string(link_.timeout_ms_ / 1000) +
                 " s (HOROVOD_PEER_TIMEOUT_SECONDS); the peer is stopped or unreachable",
             TransportError::Cause::kPeerTimeout);
      }
      MpiBackoff(idle);
    }
  }
  // Tests the MPI request; true when it finished just now.
  bool TestLocked() {
    if (done_ || !error_.empty()) return false;
    if (link_.aborted_) {
      error_ = link_.failure_.empty() ? "the link was shut down" : link_.failure_;
      return true;
    }
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      int error_class = 0;
      MPI_Error_class(rc, &error_class);
      error_ = error_class == MPI_ERR_TRUNCATE && receive_
                   ? "a tagged message from rank " + std::to_string(peer_) +
                         " larger than the receive of " + std::to_string(n_) + " bytes"
                   : "MPI error in a tagged message with rank " + std::to_string(peer_) + ": " +
                         MpiErrorString(rc);
      request_ = MPI_REQUEST_NULL;
      return true;
    }
    if (!flag) return false;
    int count = static_cast<int>(n_);
    if (receive_) MPI_Get_count(&status, MPI_BYTE, &count);
    if (static_cast<size_t>(count) != n_) {
      error_ = "a tagged message of " + std::to_string(count) + " bytes from rank " +
               std::to_string(peer_) + " for a receive of " + std::to_string(n_) + " bytes";
    } else {
      done_ = true;
    }
    return true;
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  bool receive_ = false;

 private:
  bool Check() const {
    if (!error_.empty()) throw TransportError(error_, peer_, TransportError::Cause::kPeerLost);
    return done_;
  }
  [[noreturn]] void Fail(const std::string& what, TransportError::Cause cause) {
    // Nothing of this request may land later in a buffer its owner frees: the link fails.
    link_.aborted_ = true;
    if (!link_.peers_notified_) link_.NotifyPeersOnce();
    throw TransportError(what, peer_, cause);
  }

  MpiLink& link_;
  const int peer_;
  const size_t n_;
  bool done_ = false;
  std::string error_;
};

std::unique_ptr<Link::Request> MpiLink::Post(bool send, int peer, int tag, void* buf, size_t n) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
  if (tag < 0 || tag > tag_ub_) {
    throw TransportError("tag " + std::to_string(tag) + " is beyond MPI's largest (" +
                         std::to_string(tag_ub_) + ", MPI_TAG_UB)");
  }
  if (n > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw TransportError("a tagged message over MPI is at most 2 GiB; this one is " +
                         std::to_string(n) + " bytes");
  }
  auto request = std::make_unique<MpiRequest>(*this, peer, n);
  request->receive_ = !send;
  std::lock_guard<std::mutex> lock(tagged_mutex_);
  if (!aborted_) {
    const int count = static_cast<int>(n);
    const int rc = send ? MPI_Isend(buf, count, MPI_BYTE, peer, tag, tagged_comm_,
                                    &request->request_)
                        : MPI_Irecv(buf, count, MPI_BYTE, peer, tag, tagged_comm_,
                                    &request->request_);
    if (rc != MPI_SUCCESS) {
      throw TransportError(std::string("MPI error in ") + (send ? "MPI_Isend" : "MPI_Irecv") +
                           ": " + MpiErrorString(rc), peer, TransportError::Cause::kPeerLost);
    }
  }
  in_flight_.push_back(request.get());
  return request;
}

std::unique_ptr<Link::Request> MpiLink::isend(int peer, int tag, const void* buf, size_t n) {
  return Post(true, peer, tag, const_cast<void*>(buf), n);
}

std::unique_ptr<Link::Request> MpiLink::irecv(int peer, int tag, void* buf, size_t n) {
  return Post(false, peer, tag, buf, n);
}

void MpiLink::progress(int timeout_ms) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (aborted_) throw TransportError(failure_.empty() ? "the link was shut down" : failure_);
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(tagged_mutex_);
      for (MpiRequest* request : in_flight_) finished = request->TestLocked() || finished;
    }
    if (finished || Clock::now() >= deadline) return;
    MpiBackoff(Clock::now() - start);
  }
}

}  // namespace horovodlike
