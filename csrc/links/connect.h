// Chooses and connects the job's link (the transport a user picks: tcp, mpi, gloo) from the
// configuration.
#pragma once

#include <memory>

#include "link.h"

namespace horovodlike {

struct Config;

// Connects every rank of the job; `generation` counts init() calls so a re-init rendezvouses
// under fresh keys. A backend that knows the job's layout better than the environment (MPI)
// updates the local and cross rank and size in `config`.
std::unique_ptr<Link> ConnectLink(Config& config, int generation);

// name() of the link the last successful ConnectLink returned ("tcp", "mpi", "gloo"),
// or nullptr before the first.
const char* LastLinkName();

}  // namespace horovodlike
