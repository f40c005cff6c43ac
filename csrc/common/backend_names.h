#pragma once
// The CPU transports a job can ask for (HOROVOD_CPU_OPERATIONS, HOROVOD_CONTROLLER) and their
// names: the one list that config reading, link selection and the provider table use. The
// launcher's list (src/horovodlike/runner/settings.py, TRANSPORTS) is checked against the names
// the config reader prints (tests/test_settings.py).

#include <string>

namespace horovodlike {

enum class Backend { kTcp, kMpi, kGloo };

struct BackendName {
  Backend id;
  const char* name;
};

// In the order error messages list them.
inline constexpr BackendName kBackends[] = {
    {Backend::kTcp, "tcp"},
    {Backend::kMpi, "mpi"},
    {Backend::kGloo, "gloo"},
};

inline const char* NameOf(Backend backend) {
  for (const auto& entry : kBackends) {
    if (entry.id == backend) return entry.name;
  }
  return "";
}

// Whether `name` (lower case) is a backend; its id in `*backend`.
inline bool ParseBackend(const std::string& name, Backend* backend) {
  for (const auto& entry : kBackends) {
    if (name == entry.name) {
      *backend = entry.id;
      return true;
    }
  }
  return false;
}

inline bool IsBackend(const std::string& name, Backend backend) { return name == NameOf(backend); }

// HOROVOD_GPU_OPERATIONS: NCCL, or GPU tensors staged through host memory (where a CPU
// backend's name also asks for staging, its host collectives being that backend's).
inline constexpr const char* kGpuNccl = "nccl";
inline constexpr const char* kGpuStaged = "staged";

// Whether HOROVOD_GPU_OPERATIONS=`value` (lower case) asks for staging.
inline bool AsksForStaging(const std::string& value) {
  return value == kGpuStaged || IsBackend(value, Backend::kMpi) || IsBackend(value, Backend::kGloo);
}

// "tcp, mpi, gloo"
inline std::string BackendNames() {
  std::string names;
  for (const auto& entry : kBackends) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

}  // namespace horovodlike
