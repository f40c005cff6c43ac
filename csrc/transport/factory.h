// Chooses and connects the transport for this job from the configuration.
#pragma once

#include <memory>

#include "transport.h"

namespace horovodlike {

struct Config;

// Connects every rank of the job; `generation` counts init() calls so a re-init rendezvouses
// under fresh keys.
std::unique_ptr<Transport> CreateTransport(const Config& config, int generation);

}  // namespace horovodlike
