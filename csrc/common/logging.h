// Minimal leveled logging to stderr, prefixed with the rank.
#pragma once

#include <sstream>

namespace horovodlike {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kFatal = 5 };

void SetLogLevel(int level, int rank);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& message);

}  // namespace horovodlike

#define HVDL_LOG(level, expr)                                                  \
  do {                                                                         \
    if (::horovodlike::LogEnabled(::horovodlike::LogLevel::level)) {           \
      std::ostringstream hvdl_log_stream;                                      \
      hvdl_log_stream << expr;                                                 \
      ::horovodlike::LogLine(::horovodlike::LogLevel::level, hvdl_log_stream.str()); \
    }                                                                          \
  } while (0)
