#include "library_search.h"

#include <dlfcn.h>
#include <link.h>

#include <mutex>

#include "../common/env_config.h"

namespace horovodlike {
namespace {

std::mutex g_mutex;
std::vector<std::string>* g_cudart_dirs = new std::vector<std::string>();
std::vector<std::string>* g_nccl_dirs = new std::vector<std::string>();
int g_generation = 0;

std::string LoadedPath(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

std::string LastDlError() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown error";
}

}  // namespace

void SetGpuLibraryDirs(std::vector<std::string> cudart_dirs, std::vector<std::string> nccl_dirs) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *g_cudart_dirs = std::move(cudart_dirs);
  *g_nccl_dirs = std::move(nccl_dirs);
  ++g_generation;
}

int GpuLibraryDirsGeneration() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_generation;
}

std::vector<std::string> CudartDirs() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return *g_cudart_dirs;
}

std::vector<std::string> NcclDirs() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return *g_nccl_dirs;
}

FoundLibrary FindLibrary(const char* override_env, const std::vector<std::string>& sonames,
                         const std::vector<std::string>& dirs) {
  FoundLibrary found;
  const std::string override_value = GpuLibraryPathFromEnvironment(override_env);
  const char* override_path = override_value.c_str();
  if (!override_value.empty()) {
    found.handle = dlopen(override_path, RTLD_NOW | RTLD_LOCAL);
    if (found.handle == nullptr) {
      found.error = std::string(override_env) + "=" + override_path + " could not be loaded: " +
                    LastDlError();
      return found;
    }
    found.path = LoadedPath(found.handle, override_path);
    return found;
  }
  for (const std::string& soname : sonames) {
    if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      found.handle = handle;
      found.path = LoadedPath(handle, soname);
      return found;
    }
  }
  std::string tried;
  for (const std::string& dir : dirs) {
    for (const std::string& soname : sonames) {
      const std::string path = dir + "/" + soname;
      if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        found.handle = handle;
        found.path = LoadedPath(handle, path);
        return found;
      }
      tried += "; " + LastDlError();
    }
  }
  for (const std::string& soname : sonames) {
    if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      found.handle = handle;
      found.path = LoadedPath(handle, soname);
      return found;
    }
    tried += "; " + LastDlError();
  }
  found.error = "not found (" + std::string(override_env) + " unset; tried " +
                std::to_string(dirs.size()) + " wheel folder(s) and the system library path" +
                tried + ")";
  return found;
}

void* LibrarySymbol(void* handle, const char* name) { return dlsym(handle, name); }

}  // namespace horovodlike
