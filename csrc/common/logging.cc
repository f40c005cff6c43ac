#include "logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "env_config.h"

namespace horovodlike {
namespace {
std::atomic<int> g_level{3};
std::atomic<int> g_rank{0};

// Where log lines go. The launcher hands each local rank a duplicate of the rank's stderr pipe
// under HOROVODLIKE_STDERR_FD, which output capture in the rank (pytest replaces fd 2) does
// not touch: stall warnings and the reasons a job stopped must reach the user even then.
int LogFd() {
  static const int fd = [] {
    const std::string setting = LogFdFromEnvironment();
    if (setting.empty()) return 2;
    const char* value = setting.c_str();
    // "FD:INODE": the descriptor counts only while it is still that pipe (a child process may
    // inherit the variable without the descriptor, and reuse the number for a file).
    char* end = nullptr;
    const long parsed = std::strtol(value, &end, 10);
    if (*end != ':' || parsed < 0 || parsed > 1 << 20) return 2;
    const unsigned long long inode = std::strtoull(end + 1, &end, 10);
    if (*end != '\0') return 2;
    const int candidate = static_cast<int>(parsed);
    struct stat info {};
    if (::fstat(candidate, &info) != 0 || !S_ISFIFO(info.st_mode) ||
        static_cast<unsigned long long>(info.st_ino) != inode) {
      return 2;
    }
    return candidate;
  }();
  return fd;
}
// HOROVOD_LOG_HIDE_TIME=0 (horovodlikerun --log-with-timestamp) puts the local time in every
// line; by default lines go without it, as the launcher's output is already per rank.
bool WithTimestamp() {
  static const bool with = LogTimestampFromEnvironment();
  return with;
}

std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
      1000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[40];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02d %02d:%02d:%02d.%03d ", local.tm_year + 1900,
                local.tm_mon + 1, local.tm_mday, local.tm_hour, local.tm_min, local.tm_sec,
                millis);
  return text;
}
}  // namespace

void SetLogLevel(int level, int rank) {
  g_level = level;
  g_rank = rank;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogLine(LogLevel level, const std::string& message) {
  static const char* names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  std::string line = std::string("[") + (WithTimestamp() ? Timestamp() : std::string()) +
                     "horovodlike " + names[static_cast<int>(level)] + " rank " +
                     std::to_string(g_rank.load()) + "] " + message + "\n";
  std::fflush(stderr);  // keeps the order with anything the process wrote through stdio
  // One write per line, so that lines of several threads never interleave.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(LogFd(), data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace horovodlike
