// Small control messages between the coordinator and the other ranks of a set: gather to the
// root, broadcast from it, and the bitwise AND of a bit vector (the response-cache fast path).
#pragma once

#include <cstdint>
#include <vector>

#include "../links/link.h"

namespace horovodlike {

// On the root returns every rank's message in rank order; elsewhere returns nothing.
std::vector<std::vector<uint8_t>> GatherToRoot(Link& link,
                                               const std::vector<uint8_t>& message, int root);
// The root's `message` replaces every other rank's.
void BroadcastFromRoot(Link& link, std::vector<uint8_t>& message, int root);
// Every rank's `bits` becomes the AND of all ranks' (all have the same length): by recursive
// doubling when the ranks are a power of two, else through the root. `scratch` is the receive
// buffer, kept by the caller so that a round allocates nothing. The last `equal_words` words
// are combined by equality instead: each keeps its value where every rank gave the same one,
// and becomes 0 where any two differ.
void BitwiseAndAllreduce(Link& link, std::vector<uint64_t>& bits, int root,
                         std::vector<uint64_t>& scratch, size_t equal_words = 0);

}  // namespace horovodlike
