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


}  // namespace

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

// MPI moves data only inside MPI calls, and a request's progress shows only when it completes:
// spin, yielding the core (to the peers when there are more ranks than cores) while waiting;
// sleep only once nothing has completed for a second (a stopped or vanished peer).
void MpiBackoff(std::chrono::steady_clock::duration idle) {
  if (idle < std::chrono::microseconds(50)) return;
  if (idle < std::chrono::seconds(1)) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}


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
    Fail("MPI error in " + what + ": " + MpiErrorString(mpi_error), -1,
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
  MpiBackoff(idle);
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
                   MpiErrorString(rc),
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
                   MpiErrorString(rc),
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
      GiveUp(std::string("MPI error in ") + what + ": " + MpiErrorString(rc), -1,
             TransportError::Cause::kOther, abandon);
    }
    if (done) return;
    WhileWaiting(last_progress, what, -1, abandon);
  }
}

}  // namespace horovodlike
