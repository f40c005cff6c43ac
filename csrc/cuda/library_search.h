// Finds a GPU library at run time (the core is never linked against CUDA or NCCL): an explicit
// override, a copy already loaded in the process (PyTorch's own), NVIDIA's wheels in
// site-packages (their folders given by the Python layer), then the system's library path.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace horovodlike {

struct FoundLibrary {
  void* handle = nullptr;  // dlopen's; never closed (the library may hold threads and state)
  std::string path;        // the file loaded
  std::string error;       // why none was loaded: every place tried
};

// Folders of NVIDIA's wheels, from the Python layer (horovodlike/common/gpu_libraries.py).
void SetGpuLibraryDirs(std::vector<std::string> cudart_dirs, std::vector<std::string> nccl_dirs);
std::vector<std::string> CudartDirs();
std::vector<std::string> NcclDirs();
// Counts SetGpuLibraryDirs calls.
int GpuLibraryDirsGeneration();

// `load()`'s result, made on first use and kept for the process; made again only while the
// library was not located at all and the wheels' folders changed since (a caller that asked
// before the Python layer said where they are). `Loaded` has a bool `located`.
template <class Loaded>
const Loaded& LoadOnce(Loaded* (*load)()) {
  static std::mutex mutex;
  static Loaded* loaded = nullptr;
  static int generation = -1;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded == nullptr || (!loaded->located && generation != GpuLibraryDirsGeneration())) {
    generation = GpuLibraryDirsGeneration();
    loaded = load();  // an earlier result is kept: references into it may be held
  }
  return *loaded;
}

// `override_env` names a file that, when set, is the only place tried (a typo must not be
// covered up by another copy); otherwise each soname is looked for as loaded already, in each
// of `dirs`, and on the system path, in that order.
FoundLibrary FindLibrary(const char* override_env, const std::vector<std::string>& sonames,
                         const std::vector<std::string>& dirs);

// The symbol, or nullptr.
void* LibrarySymbol(void* handle, const char* name);

// Sets `*out` to the symbol `name` of `handle`; when it is missing, adds the name to `*missing`
// (a list for the error), unless `missing` is null (an optional symbol).
template <class Fn>
void ResolveSymbol(void* handle, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(LibrarySymbol(handle, name));
  if (*out == nullptr && missing != nullptr) {
    *missing += std::string(missing->empty() ? "" : ", ") + name;
  }
}

}  // namespace horovodlike
