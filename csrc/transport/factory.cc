#include "factory.h"

#include "../core/env_config.h"
#include "tcp.h"

namespace horovodlike {

std::unique_ptr<Transport> CreateTransport(const Config& config, int generation) {
  return TcpTransport::Connect(config, generation);
}

}  // namespace horovodlike
