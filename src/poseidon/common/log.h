// Minimal leveled logging to stderr with a rank prefix: "[rank 1] error: MSG".
// A message that starts with the prefix itself ("rank 1: ...") does not repeat it.
//
// The level and the prefix are process settings made once by the CLI
// (config layer); library code only writes. Thread-safe: a line is formatted
// first and written with one call.
#pragma once

#include <sstream>
#include <string>

namespace poseidon {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

void setLogLevel(LogLevel level);
LogLevel logLevel();
// Parses "debug|info|warning|error|off"; throws InvalidArgument otherwise.
LogLevel parseLogLevel(const std::string& text);
// POSEIDON_LOG (empty: unset) as the level, for every entry point: the poseidon command and the
// Python package. Throws InvalidArgument("POSEIDON_LOG: unknown log level ...").
void setLogLevelFromEnvironment();
void setLogPrefix(const std::string& prefix);

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

}  // namespace poseidon

#define POSEIDON_LOG(level)                                                   \
  if (::poseidon::LogLevel::level < ::poseidon::logLevel()) {                 \
  } else                                                                      \
    ::poseidon::LogLine(::poseidon::LogLevel::level)
