// Notices a Gloo peer that went away. Gloo 0.5's TCP pair treats a connection closed cleanly
// by its peer (a rank that exited, was killed while idle, or stopped after an error) as a
// quiet state change: an operation waiting on that peer would wait out its whole timeout. So
// each rank also holds one idle TCP connection per peer; the kernel closes it when the peer's
// process ends, and the peer closes it when it aborts. A thread polls these sockets and
// reports the first hang-up of each.
#pragma once

#include <functional>
#include <thread>
#include <vector>

namespace horovodlike {

class GlooHangupWatcher {
 public:
  // `peer_sockets[r]`: the idle connection to rank r, -1 for this rank; nothing may be sent
  // on them. `on_hangup(r)` runs on the watcher's thread once rank r closed its end.
  GlooHangupWatcher(std::vector<int> peer_sockets, std::function<void(int rank)> on_hangup);
  ~GlooHangupWatcher();  // stops and joins the thread
  GlooHangupWatcher(const GlooHangupWatcher&) = delete;
  GlooHangupWatcher& operator=(const GlooHangupWatcher&) = delete;

 private:
  void Run();

  std::vector<int> peer_sockets_;
  std::function<void(int)> on_hangup_;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace horovodlike
