#include "tcp_mesh_over_mpi.h"

#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/hmac.h"
#include "../tcp/socket_util.h"
#include "../tcp/tcp_link.h"

namespace horovodlike {
namespace {

constexpr size_t kHostBytes = 256;
constexpr size_t kAddressBytes = 64;
constexpr size_t kSecretBytes = 32;

struct Entry {
  char host[kHostBytes];
  char address[kAddressBytes];  // "ip:port"
};

void Check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    throw TransportError(std::string("point-to-point set-up over MPI: ") + what + " failed");
  }
}

}  // namespace

std::unique_ptr<Link> ConnectTcpMeshOverMpi(const Config& config, int generation) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw TransportError("point-to-point set-up over MPI: MPI is not running in this process");
  }
  // A communicator of its own, so that nothing else's messages can match these.
  MPI_Comm comm = MPI_COMM_NULL;
  Check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  struct FreeComm {
    MPI_Comm* comm;
    ~FreeComm() { MPI_Comm_free(comm); }
  } free_comm{&comm};

  // The job's secret for the handshake: rank 0's random bytes, unless the environment set one.
  Config mesh_config = config;
  uint8_t secret[kSecretBytes] = {};
  if (config.rank == 0) RandomBytes(secret, kSecretBytes);
  Check(MPI_Bcast(secret, kSecretBytes, MPI_BYTE, 0, comm), "MPI_Bcast");
  if (mesh_config.secret_key.empty()) mesh_config.secret_key = ToHex(secret, kSecretBytes);

  const std::string address = config.network_interface.empty()
                                  ? FirstNonLoopbackAddress()
                                  : InterfaceAddress(config.network_interface);
  int port = 0;
  int listen_fd = ListenOn("0.0.0.0", &port);
  std::vector<Entry> entries(static_cast<size_t>(config.size));
  try {
    Entry mine{};
    char host[kHostBytes] = {};
    gethostname(host, kHostBytes - 1);
    std::strncpy(mine.host, host, kHostBytes - 1);
    const std::string published = address + ":" + std::to_string(port);
    std::strncpy(mine.address, published.c_str(), kAddressBytes - 1);
    Check(MPI_Allgather(&mine, sizeof(Entry), MPI_BYTE, entries.data(), sizeof(Entry), MPI_BYTE,
                        comm),
          "MPI_Allgather");
  } catch (...) {
    ::close(listen_fd);
    throw;
  }
  std::vector<std::string> addresses;
  const std::string my_host = entries[static_cast<size_t>(config.rank)].host;
  for (const Entry& entry : entries) {
    std::string peer_address = entry.address;
    // A peer on this host is reached over loopback, whatever its interfaces.
    if (my_host == entry.host) {
      peer_address = "127.0.0.1" + peer_address.substr(peer_address.rfind(':'));
    }
    addresses.push_back(peer_address);
  }
  return TcpLink::ConnectWithAddresses(mesh_config, generation, listen_fd, addresses);
}

}  // namespace horovodlike
