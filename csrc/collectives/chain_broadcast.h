// Broadcast along a chain starting at the root, pipelined in segments: each rank forwards a
// segment while its upstream is already sending the next one.
#pragma once

#include <cstddef>

#include "../links/link.h"

namespace horovodlike {

void ChainBroadcast(Link& link, void* buf, size_t bytes, int root);

}  // namespace horovodlike
