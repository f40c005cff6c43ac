// A TCP mesh for a job that mpirun started directly, where there is no launcher rendezvous to
// publish addresses in: the addresses, and a secret for the mesh's handshake, are exchanged
// with MPI collectives over MPI_COMM_WORLD instead. Point-to-point uses it (core/point_to_point.h)
// so that its messages never wait behind MPI's progress or share MPI with the background loop.
// Compiled only when CMake finds MPI.
#pragma once

#include <memory>
#include <string>

#include "../link.h"

namespace horovodlike {

struct Config;

// Collective over every rank of the job; call it while no other thread uses MPI (init()).
// Listens on every interface; a rank publishes HOROVOD_GLOO_IFACE's address when set, else its
// first non-loopback IPv4 address, and ranks on one host (same host name) dial 127.0.0.1.
std::unique_ptr<Link> ConnectTcpMeshOverMpi(const Config& config, int generation);

}  // namespace horovodlike
