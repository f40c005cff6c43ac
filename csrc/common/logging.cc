#include "logging.h"

#include <atomic>
#include <cstdio>

namespace horovodlike {
namespace {
std::atomic<int> g_level{3};
std::atomic<int> g_rank{0};
}  // namespace

void SetLogLevel(int level, int rank) {
  g_level = level;
  g_rank = rank;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogLine(LogLevel level, const std::string& message) {
  static const char* names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  std::fprintf(stderr, "[horovodlike %s rank %d] %s\n", names[static_cast<int>(level)],
               g_rank.load(), message.c_str());
  std::fflush(stderr);
}

}  // namespace horovodlike
