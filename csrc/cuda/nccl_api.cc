#include "nccl_api.h"

#include "../common/common.h"
#include "library_search.h"

namespace horovodlike {
namespace {

struct Loaded {
  bool located = false;  // the file was found (it may still be unusable: `error`)
  NcclApi api;
  std::string error;
};

// NCCL's codes: major*1000+minor*100+patch before 2.9, major*10000+minor*100+patch since.
std::string VersionName(int code) {
  int major, minor, patch;
  if (code >= 10000) {
    major = code / 10000, minor = code % 10000 / 100, patch = code % 100;
  } else {
    major = code / 1000, minor = code % 1000 / 100, patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// The same scale for both encodings.
int Normalized(int code) {
  if (code >= 10000) return code;
  return code / 1000 * 10000 + code % 1000 / 100 * 100 + code % 100;
}

Loaded* Load() {
  auto* loaded = new Loaded();
  FoundLibrary found = FindLibrary("HOROVOD_NCCL_PATH", {"libnccl.so.2", "libnccl.so"},
                                   NcclDirs());
  if (found.handle == nullptr) {
    loaded->error = "NCCL (libnccl) was " + found.error;
    return loaded;
  }
  loaded->located = true;
  NcclApi& api = loaded->api;
  api.path = found.path;
  void* h = found.handle;
  std::string missing;
  ResolveSymbol(h, "ncclGetVersion", &api.GetVersion, &missing);
  ResolveSymbol(h, "ncclGetUniqueId", &api.GetUniqueId, &missing);
  ResolveSymbol(h, "ncclCommInitRank", &api.CommInitRank, &missing);
  ResolveSymbol(h, "ncclCommDestroy", &api.CommDestroy, &missing);
  ResolveSymbol(h, "ncclCommAbort", &api.CommAbort, &missing);
  ResolveSymbol(h, "ncclCommGetAsyncError", &api.CommGetAsyncError, &missing);
  ResolveSymbol(h, "ncclGetErrorString", &api.GetErrorString, &missing);
  ResolveSymbol(h, "ncclAllReduce", &api.AllReduce, &missing);
  ResolveSymbol(h, "ncclBroadcast", &api.Broadcast, &missing);
  ResolveSymbol(h, "ncclReduce", &api.Reduce, &missing);
  ResolveSymbol(h, "ncclAllGather", &api.AllGather, &missing);
  ResolveSymbol(h, "ncclReduceScatter", &api.ReduceScatter, &missing);
  ResolveSymbol(h, "ncclSend", &api.Send, &missing);
  ResolveSymbol(h, "ncclRecv", &api.Recv, &missing);
  ResolveSymbol(h, "ncclGroupStart", &api.GroupStart, &missing);
  ResolveSymbol(h, "ncclGroupEnd", &api.GroupEnd, &missing);
  if (api.GetVersion != nullptr) {
    int code = 0;
    if (api.GetVersion(&code) == kNcclSuccess) {
      api.version = Normalized(code);
      api.version_name = VersionName(code);
    }
  }
  if (!missing.empty()) {
    loaded->error = "NCCL " + api.path +
                    (api.version_name.empty() ? "" : " (version " + api.version_name + ")") +
                    " lacks " + missing;
    return loaded;
  }
  if (api.version < kMinNcclVersion) {
    loaded->error = "NCCL " + api.path + " is version " + api.version_name +
                    "; horovodlike needs 2.7 or newer";
    return loaded;
  }
  // Newer features: used only where the version has them and the symbol is there.
  api.has_avg = api.version >= 21000;
  if (api.version >= 21100) {
    ResolveSymbol(h, "ncclRedOpCreatePreMulSum", &api.RedOpCreatePreMulSum, nullptr);
    ResolveSymbol(h, "ncclRedOpDestroy", &api.RedOpDestroy, nullptr);
    api.has_premulsum = api.RedOpCreatePreMulSum != nullptr && api.RedOpDestroy != nullptr;
  }
  if (api.version >= 21800) {
    ResolveSymbol(h, "ncclCommSplit", &api.CommSplit, nullptr);
    api.has_split = api.CommSplit != nullptr;
  }
  return loaded;
}

const Loaded& Get() { return LoadOnce(&Load); }

}  // namespace

std::string NcclApi::ErrorString(ncclResult_t result) const {
  const char* text = GetErrorString != nullptr ? GetErrorString(result) : nullptr;
  return (text != nullptr ? text : "NCCL error") + std::string(" (") + std::to_string(result) +
         ")";
}

void NcclApi::Check(ncclResult_t result, const char* what) const {
  if (result != kNcclSuccess) {
    throw TransportError(std::string(what) + ": " + ErrorString(result));
  }
}

GpuLibraryStatus NcclStatus() {
  const Loaded& loaded = Get();
  GpuLibraryStatus status;
  status.found = loaded.error.empty();
  status.path = loaded.api.path;
  status.version = loaded.api.version_name;
  status.error = loaded.error;
  return status;
}

const NcclApi& Nccl() {
  const Loaded& loaded = Get();
  if (!loaded.error.empty()) {
    throw InvalidArgument(loaded.error + ". Install NCCL (pip install nvidia-nccl-cu12), set "
                          "HOROVOD_NCCL_PATH to libnccl.so.2, or stage through host memory "
                          "with HOROVOD_GPU_OPERATIONS=staged");
  }
  return loaded.api;
}

bool NcclUsable() { return Get().error.empty(); }

}  // namespace horovodlike
