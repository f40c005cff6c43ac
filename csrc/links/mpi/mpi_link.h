// The MPI link: point-to-point over a duplicate of MPI_COMM_WORLD, for jobs started by mpirun.
// MPI's own collectives over its communicator are providers (collectives/mpi/). Compiled only
// when CMake finds MPI.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../link.h"

namespace horovodlike {

struct Config;

// MPI's text for an error code; a pause between the tests of a wait that made no progress for
// `idle` (spin, then yield, then sleep). Shared by the link's files.
std::string MpiErrorString(int code);
void MpiBackoff(std::chrono::steady_clock::duration idle);

class MpiLink : public Link {
 public:
  // Initializes MPI once per process (MPI_Finalize runs at process exit, so init() may follow
  // shutdown()), duplicates MPI_COMM_WORLD, and replaces the topology fields of `config`
  // (local and cross rank and size) with what MPI reports. Collective over all ranks.
  static std::unique_ptr<MpiLink> Connect(Config& config);
  ~MpiLink() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  // Makes pending and later calls throw TransportError and tells every peer, whose pending and
  // later calls then throw too (MPI has no connection to close; MPI_Abort would end the job).
  void abort() override;
  // Tagged messages are MPI's own: MPI_Isend/MPI_Irecv with the tag, on a communicator of
  // their own (MPI matches them), when MPI allows calls from several threads at once.
  bool tagged() const override { return threads_multiple_; }
  std::unique_ptr<Link::Request> isend(int peer, int tag, const void* buf, size_t n) override;
  std::unique_ptr<Link::Request> irecv(int peer, int tag, void* buf, size_t n) override;
  void progress(int timeout_ms) override;
  const char* name() const override { return "mpi"; }
  bool interruptible() const override { return true; }

  // For the providers that run MPI's own collectives (collectives/mpi/).
  MpiLink* mpi() override { return this; }
  MPI_Comm comm() const { return comm_; }
  // Throws TransportError once the link has failed or was aborted.
  void CheckUsable();
  // Waits for `request`, a collective on comm(), failing as a transfer does (a peer's abort
  // notice, abort(), the peer timeout). A request given up on keeps `buffer`, which MPI may
  // still write into, until it completes (AbandonedTransfers).
  void AwaitCollective(MPI_Request& request, const char* what, std::vector<char>& buffer);
  // Transfers given up on after a failure that MPI has not completed yet, in this process;
  // each is released (request and memory) once it completes.
  static size_t AbandonedTransfers();

 private:
  class MpiRequest;
  MpiLink(MPI_Comm comm, MPI_Comm tagged_comm, int rank, int size, bool threads_multiple);
  std::unique_ptr<Link::Request> Post(bool send, int peer, int tag, void* buf, size_t n);
  using Clock = std::chrono::steady_clock;
  // Between two rounds of a wait that made no progress: fails (after `abandon` has withdrawn
  // what is in flight) on a peer's abort notice, on abort(), or once nothing has progressed
  // for the peer timeout since `last_progress`, blaming `silent` (-1: unknown); else backs off.
  void WhileWaiting(Clock::time_point last_progress, const char* what, int silent,
                    const std::function<void()>& abandon);
  [[noreturn]] void GiveUp(const std::string& message, int peer, TransportError::Cause cause,
                           const std::function<void()>& abandon);
  // Cancels the point-to-point requests still pending, waits briefly, frees what is left.
  void Withdraw(MPI_Request* requests, int count);
  // Moves bytes already received from `peer` to the caller's buffer.
  void TakeFromInbox(int peer, char*& rp, size_t& rn);
  void NotifyPeersOnce();
  static void Abandon(MPI_Request& request, std::vector<char>&& buffer);
  // Marks the link failed (later calls throw `message` too) and throws.
  [[noreturn]] void Fail(const std::string& message, int peer, TransportError::Cause cause);
  void Check(int mpi_error, const std::string& what);

  MPI_Comm comm_;
  MPI_Comm tagged_comm_;  // the tagged messages'
  int rank_;
  int size_;
  bool threads_multiple_;  // MPI may be called from abort()'s thread while the loop is in MPI
  int timeout_ms_ = 300000;
  MPI_Request abort_notice_request_ = MPI_REQUEST_NULL;  // receives a peer's abort notice
  int abort_notice_ = -1;                                // the rank that sent it
  std::atomic<bool> aborted_{false};
  std::atomic<bool> peers_notified_{false};
  std::mutex notify_mutex_;
  std::string failure_;       // why later calls fail, once a peer's notice arrived
  // Per peer: the rest of a message larger than the receive that took it in.
  struct Inbox {
    std::vector<char> bytes;
    size_t offset = 0;  // next byte to hand out
    size_t size = 0;    // bytes of the message
  };
  std::vector<Inbox> inbox_;
  // The tagged requests in flight, for progress() to test (guarded by tagged_mutex_).
  std::mutex tagged_mutex_;
  std::vector<MpiRequest*> in_flight_;
  int tag_ub_ = 32767;  // MPI_TAG_UB
};

}  // namespace horovodlike
