// The poll bell: how a rank of the host wakes a peer that sleeps in poll() on its TCP
// connections, which a futex word cannot. A rank whose job also has peers on other hosts waits
// for tagged messages (point-to-point, pipelines) from both kinds at once: it sleeps in poll()
// on its sockets and on this process's bell, with its `polling` count set in its control
// block (shm_layout.h); a peer of the host that publishes something for it then sends one
// byte to the bell (ShmLink::Notify), and the message is read at once instead of at the end
// of the poll's slice.
//
// One abstract UNIX datagram socket per process, named after its pid and a random token that
// only the job's segment holds (RankControl::bell_token), so that nothing outside the job
// finds it by name. Best effort: a ring that cannot be sent (a peer in another network
// namespace, say) costs what the bell saves, the rest of the poll's slice.
#pragma once

#include <cstdint>

namespace horovodlike {
namespace shm {

// This process's bell, opened on first use: its descriptor (-1 when it cannot be opened) and
// the token its name carries (0 then).
int PollBellFd();
uint64_t PollBellToken();
// Reads whatever rings are waiting on this process's bell, without blocking.
void DrainPollBell();
// Rings the bell of process `pid` whose token is `token`; never blocks. False when the ring
// could not be sent.
bool RingPollBell(int pid, uint64_t token);

}  // namespace shm
}  // namespace horovodlike
