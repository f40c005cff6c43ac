#include "mpi_link.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/interrupt.h"

namespace horovodlike {
namespace {

constexpr int kDataTag = 1;
constexpr int kAbortTag = 2;
// MPI counts are ints; larger transfers move in pieces of this many bytes.
constexpr size_t kMaxMessageBytes = size_t{1} << 30;
// MPI's allreduce is used up to this size, where latency rules and its algorithms take fewer
// steps than the ring's 2(n - 1). Above it the ring over point-to-point, which overlaps the
// reduction with the transfer, was 2-3x faster at 16-64 MiB (Open MPI 4.1.4, 2 ranks, shared
// memory; benchmarks/ should refine this).
constexpr size_t kNativeMaxBytes = size_t{256} << 10;
// How long a failed transfer is given to withdraw its pending receives before they are left.
constexpr auto kWithdrawGrace = std::chrono::seconds(1);
// What an abort notice carries; the receiver learns the sender from the status. Static, so it
// outlives the freed send requests that read it.
const int kAbortNoticePayload = 1;

// --- MPI's lifetime in this process ---------------------------------------------------------
// MPI can be initialized once per process and never again after MPI_Finalize, while
// horovodlike's init() may follow shutdown(). So MPI starts with the first MPI link and
// ends at process exit. When something else (mpi4py) initialized MPI, it also finalizes it.
std::mutex g_mpi_mutex;
std::atomic<int> g_live_links{0};
// Transfers given up on after a failure, with the memory MPI may still write into; kept until
// MPI reports them complete (a receive whose message lands late, a collective a peer finishes
// late), then released. Guarded by g_mpi_mutex; process-wide, as they outlive their link.
struct AbandonedTransfer {
  MPI_Request request;
  std::vector<char> buffer;
};
std::vector<AbandonedTransfer> g_abandoned;

// Releases the abandoned transfers that have completed since; with the lock held.
void ReapAbandonedLocked() {
  for (auto it = g_abandoned.begin(); it != g_abandoned.end();) {
    int done = 0;
    if (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
      it = g_abandoned.erase(it);
    } else {
      ++it;
    }
  }
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A link still alive here means exit without shutdown(); finalizing under its feet
  // would crash, and mpirun reports the missing MPI_Finalize instead.
  if (!finalized && g_live_links.load() == 0) MPI_Finalize();
}

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

// Open MPI loads its components with dlopen and they expect libmpi's symbols to be global;
// Python loaded us (and with us libmpi) RTLD_LOCAL. Re-opening libmpi RTLD_GLOBAL fixes that.
void MakeMpiSymbolsGlobal() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) != 0 && info.dli_fname) {
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }
}

// Returns whether MPI allows calls from several threads at once.
bool EnsureMpiInitialized(bool threads_disabled) {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw TransportError("MPI was already finalized in this process (by another library); the "
                         "MPI link cannot start again");
  }
  if (!initialized) {
    MakeMpiSymbolsGlobal();
    int provided = 0;
    // The loop calls MPI from its own thread, init() and shutdown() from the caller's; abort()
    // tells the peers at once only when MPI allows concurrent calls.
    // HOROVOD_MPI_THREADS_DISABLE=1 (--mpi-threads-disable) asks for the least that works:
    // one thread at a time.
    if (MPI_Init_thread(nullptr, nullptr,
                        threads_disabled ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE,
                        &provided) != MPI_SUCCESS) {
      throw TransportError("MPI_Init_thread failed");
    }
    std::atexit(FinalizeAtExit);
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    throw TransportError(std::string("MPI was initialized with ") + ThreadLevelName(provided) +
                         " (by mpi4py or another library?); horovodlike calls MPI from its "
                         "background thread and needs MPI_THREAD_SERIALIZED or "
                         "MPI_THREAD_MULTIPLE");
  }
  return provided >= MPI_THREAD_MULTIPLE;
}

// --- helpers --------------------------------------------------------------------------------

std::string ErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

// MPI moves data only inside MPI calls, and a request's progress shows only when it completes:
// spin, yielding the core (to the peers when there are more ranks than cores) while waiting;
// sleep only once nothing has completed for a second (a stopped or vanished peer).
void Backoff(std::chrono::steady_clock::duration idle) {
  if (idle < std::chrono::microseconds(50)) return;
  if (idle < std::chrono::seconds(1)) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

std::unique_ptr<MpiLink> MpiLink::Connect(Config& config) {
  if (!config.launched_by_mpirun && config.size > 1) {
    throw InvalidArgument("the MPI transport needs a job started by mpirun "
                          "(horovodlikerun --mpi, or mpirun itself); this rank of " +
                          std::to_string(config.size) + " was not started by mpirun");
  }
  const double timeout_seconds = config.peer_timeout_seconds;
  const bool threads_multiple = EnsureMpiInitialized(config.mpi_threads_disabled);

  MPI_Comm comm = MPI_COMM_NULL, tagged_comm = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &tagged_comm) != MPI_SUCCESS) {
    throw TransportError("MPI_Comm_dup(MPI_COMM_WORLD) failed");
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(tagged_comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (rank != config.rank || size != config.size) {
    MPI_Comm_free(&comm);
    MPI_Comm_free(&tagged_comm);
    throw InvalidArgument("MPI says this is rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + ", but the environment says rank " +
                          std::to_string(config.rank) + " of " + std::to_string(config.size) +
                          " (HOROVOD_RANK/HOROVOD_SIZE set for a job that mpirun started?)");
  }
  // Ranks on one host share memory; ranks with the same local rank form a cross group.
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &config.local_rank);
  MPI_Comm_size(local, &config.local_size);
  MPI_Comm_split(comm, config.local_rank, rank, &cross);
  MPI_Comm_rank(cross, &config.cross_rank);
  MPI_Comm_size(cross, &config.cross_size);
  MPI_Comm_free(&local);
  MPI_Comm_free(&cross);

  std::unique_ptr<MpiLink> link(new MpiLink(comm, tagged_comm, rank, size, threads_multiple));
  link->timeout_ms_ = static_cast<int>(timeout_seconds * 1000);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr) link->tag_ub_ = *tag_ub;
  return link;
}

MpiLink::MpiLink(MPI_Comm comm, MPI_Comm tagged_comm, int rank, int size, bool threads_multiple)
    : comm_(comm), tagged_comm_(tagged_comm), rank_(rank), size_(size),
      threads_multiple_(threads_multiple),
      inbox_(static_cast<size_t>(size)) {
  ++g_live_links;
  {
    std::lock_guard<std::mutex> lock(g_mpi_mutex);
    ReapAbandonedLocked();
  }
  MPI_Irecv(&abort_notice_, 1, MPI_INT, MPI_ANY_SOURCE, kAbortTag, comm_, &abort_notice_request_);
}

MpiLink::~MpiLink() {
  // Runs after the loop thread has ended: MPI calls from here are serialized.
  if (aborted_) NotifyPeersOnce();
  if (abort_notice_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&abort_notice_request_);
    MPI_Wait(&abort_notice_request_, MPI_STATUS_IGNORE);
  }
  // After a failure the communicator is kept: messages of the failed exchange may still be
  // in flight, and Open MPI would hand a freed communicator's id, with them, to the next
  // init()'s communicator.
  if (!aborted_) {
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&tagged_comm_);
  }
  --g_live_links;
}

void MpiLink::Check(int mpi_error, const std::string& what) {
  if (mpi_error != MPI_SUCCESS) {
    Fail("MPI error in " + what + ": " + ErrorString(mpi_error), -1,
         TransportError::Cause::kOther);
  }
}

void MpiLink::Fail(const std::string& message, int peer, TransportError::Cause cause) {
  aborted_ = true;
  if (failure_.empty()) failure_ = message;
  throw TransportError(message, peer, cause);
}

void MpiLink::CheckUsable() {
  if (!aborted_) return;
  if (!peers_notified_) NotifyPeersOnce();
  throw TransportError(failure_.empty() ? "the link was shut down" : failure_);
}

void MpiLink::NotifyPeersOnce() {
  std::lock_guard<std::mutex> lock(notify_mutex_);
  if (peers_notified_.exchange(true)) return;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Request request;
    if (MPI_Isend(&kAbortNoticePayload, 1, MPI_INT, peer, kAbortTag, comm_, &request) ==
        MPI_SUCCESS) {
      MPI_Request_free(&request);  // small enough to go eagerly; nobody waits for it
    }
  }
}

void MpiLink::abort() {
  aborted_ = true;
  // With only MPI_THREAD_SERIALIZED the loop thread may be inside MPI: it notifies the peers
  // when it sees the flag, or the destructor does.
  if (threads_multiple_) NotifyPeersOnce();
}

void MpiLink::Withdraw(MPI_Request* requests, int count) {
  // A receive that has not matched is cancelled at once; one that has is let finish for a
  // moment, so that its data does not land after the caller has freed the buffer.
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) MPI_Cancel(&requests[i]);
  }
  const auto deadline = std::chrono::steady_clock::now() + kWithdrawGrace;
  bool pending = true;
  while (pending && std::chrono::steady_clock::now() < deadline) {
    pending = false;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
      if (!done) pending = true;
    }
    if (pending) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) MPI_Request_free(&requests[i]);
  }
}

void MpiLink::GiveUp(const std::string& message, int peer, TransportError::Cause cause,
                          const std::function<void()>& abandon) {
  aborted_ = true;
  if (!peers_notified_) NotifyPeersOnce();
  abandon();
  Fail(message, peer, cause);
}

void MpiLink::WhileWaiting(Clock::time_point last_progress, const char* what, int silent,
                                const std::function<void()>& abandon) {
  if (abort_notice_request_ != MPI_REQUEST_NULL) {
    int noticed = 0;
    MPI_Status status;
    MPI_Test(&abort_notice_request_, &noticed, &status);
    if (noticed) {
      GiveUp("rank " + std::to_string(status.MPI_SOURCE) +
                 " stopped after an error (see its log) while this rank was in " + what,
             status.MPI_SOURCE, TransportError::Cause::kPeerLost, abandon);
    }
  }
  if (aborted_) {
    GiveUp(failure_.empty() ? "the link was shut down" : failure_, -1,
           TransportError::Cause::kOther, abandon);
  }
  const auto idle = Clock::now() - last_progress;
  if (idle >= kInterruptAfter && InterruptRequested()) {
    GiveUp(InterruptedWaitMessage(silent) + " in " + what, silent,
           TransportError::Cause::kInterrupted, abandon);
  }
  if (idle > std::chrono::milliseconds(timeout_ms_)) {
    GiveUp(std::string("no progress ") +
               (silent >= 0 ? "from rank " + std::to_string(silent) + " " : "") + "in " + what +
               " for " + std::to_string(timeout_ms_ / 1000) +
               " s (HOROVOD_PEER_TIMEOUT_SECONDS); a peer is stopped or unreachable",
           silent, TransportError::Cause::kPeerTimeout, abandon);
  }
  Backoff(idle);
}

void MpiLink::TakeFromInbox(int peer, char*& rp, size_t& rn) {
  Inbox& inbox = inbox_[peer];
  const size_t n = std::min(rn, inbox.size - inbox.offset);
  if (n == 0) return;
  std::memcpy(rp, inbox.bytes.data() + inbox.offset, n);
  inbox.offset += n;
  rp += n;
  rn -= n;
}

void MpiLink::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                            size_t rn) {
  CheckUsable();
  auto check_peer = [this](int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw TransportError("no connection to rank " + std::to_string(peer));
    }
  };
  if (sn > 0) check_peer(to);
  if (rn > 0) check_peer(from);
  const auto* sp = static_cast<const char*>(sbuf);
  auto* rp = static_cast<char*>(rbuf);
  // A byte stream, as over TCP: the sender's calls need not match the receiver's. Each send is
  // one message (in pieces of at most kMaxMessageBytes); the receiver probes for the next
  // message's size and takes it straight into place when it fits, else into the peer's inbox,
  // whose rest the next calls take first.
  if (rn > 0) TakeFromInbox(from, rp, rn);
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // receive, send
  const int peers[2] = {from, to};
  int send_bytes = 0, recv_bytes = 0;
  bool recv_into_inbox = false;
  auto abandon = [&] {
    if (recv_into_inbox && requests[0] != MPI_REQUEST_NULL) {
      // The message may still land after this: the inbox it lands in is kept until it has.
      Abandon(requests[0], std::move(inbox_[from].bytes));
    }
    Withdraw(requests, 2);
  };
  auto last_progress = Clock::now();
  while (sn > 0 || rn > 0 || requests[0] != MPI_REQUEST_NULL ||
         requests[1] != MPI_REQUEST_NULL) {
    if (requests[1] == MPI_REQUEST_NULL && sn > 0) {
      send_bytes = static_cast<int>(std::min(sn, kMaxMessageBytes));
      Check(MPI_Isend(sp, send_bytes, MPI_BYTE, to, kDataTag, comm_, &requests[1]), "MPI_Isend");
    }
    if (requests[0] == MPI_REQUEST_NULL && rn > 0) {
      int found = 0;
      MPI_Message message;
      MPI_Status status;
      int rc = MPI_Improbe(from, kDataTag, comm_, &found, &message, &status);
      if (rc != MPI_SUCCESS) {
        GiveUp("MPI error in MPI_Improbe from rank " + std::to_string(from) + ": " +
                   ErrorString(rc),
               from, TransportError::Cause::kPeerLost, abandon);
      }
      if (found) {
        MPI_Get_count(&status, MPI_BYTE, &recv_bytes);
        recv_into_inbox = static_cast<size_t>(recv_bytes) > rn;
        char* target = rp;
        if (recv_into_inbox) {
          Inbox& inbox = inbox_[from];  // empty: it was drained before anything new came in
          if (inbox.bytes.size() < static_cast<size_t>(recv_bytes)) inbox.bytes.resize(recv_bytes);
          inbox.offset = inbox.size = 0;
          target = inbox.bytes.data();
        }
        Check(MPI_Imrecv(target, recv_bytes, MPI_BYTE, &message, &requests[0]), "MPI_Imrecv");
      }
    }
    bool progressed = false;
    for (int i = 0; i < 2; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      int rc = MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        GiveUp("MPI error in a transfer with rank " + std::to_string(peers[i]) + ": " +
                   ErrorString(rc),
               peers[i], TransportError::Cause::kPeerLost, abandon);
      }
      if (!done) continue;
      progressed = true;
      if (i == 1) {
        sp += send_bytes;
        sn -= static_cast<size_t>(send_bytes);
      } else if (recv_into_inbox) {
        inbox_[from].size = static_cast<size_t>(recv_bytes);
        TakeFromInbox(from, rp, rn);
        recv_into_inbox = false;
      } else {
        rp += recv_bytes;
        rn -= static_cast<size_t>(recv_bytes);
      }
    }
    if (progressed) {
      last_progress = Clock::now();
      continue;
    }
    // The peer still owing its part: the one this rank receives from, while it does.
    const int silent = (rn > 0 || requests[0] != MPI_REQUEST_NULL) ? from : to;
    WhileWaiting(last_progress, "a transfer", silent, abandon);
  }
}

void MpiLink::Abandon(MPI_Request& request, std::vector<char>&& buffer) {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  g_abandoned.push_back({request, std::move(buffer)});
  request = MPI_REQUEST_NULL;
}

size_t MpiLink::AbandonedTransfers() {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) ReapAbandonedLocked();
  return g_abandoned.size();
}

void MpiLink::AwaitCollective(MPI_Request& request, const char* what,
                              std::vector<char>& buffer) {
  // MPI forbids cancelling or freeing a collective's request, and it may still write into
  // `buffer`: both are kept until the request completes.
  auto abandon = [&] { Abandon(request, std::move(buffer)); };
  auto last_progress = Clock::now();
  while (true) {
    int done = 0;
    int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      GiveUp(std::string("MPI error in ") + what + ": " + ErrorString(rc), -1,
             TransportError::Cause::kOther, abandon);
    }
    if (done) return;
    WhileWaiting(last_progress, what, -1, abandon);
  }
}

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
      Backoff(idle);
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
                         ErrorString(rc);
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
                           ": " + ErrorString(rc), peer, TransportError::Cause::kPeerLost);
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
    Backoff(Clock::now() - start);
  }
}

}  // namespace horovodlike
