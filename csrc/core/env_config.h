// Runtime settings, read once per init() from Horovod's environment variable names.
#pragma once

#include <cstdint>
#include <string>

namespace horovodlike {

struct Config {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;

  std::string rendezvous_addr;  // empty: no launcher (single process)
  int rendezvous_port = 0;
  std::string secret_key;
  std::string network_interface;  // HOROVOD_GLOO_IFACE
  double start_timeout_seconds = 30.0;

  int64_t fusion_threshold_bytes = 128LL * 1024 * 1024;
  double cycle_time_ms = 1.0;
  int cache_capacity = 1024;
  bool stall_check_enabled = true;
  double stall_warning_seconds = 60.0;
  int log_level = 3;  // 0 trace, 1 debug, 2 info, 3 warning, 4 error, 5 fatal

  // Reads HOROVOD_* variables; throws InvalidArgument naming the variable on a bad value.
  static Config FromEnvironment();
};

}  // namespace horovodlike
