#include "poseidon/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>

#include "poseidon/common/error.h"

namespace poseidon {
namespace {
std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarning)};
std::mutex gPrefixMutex;
std::string gPrefix = "poseidon";  // guarded by gPrefixMutex
}  // namespace

void setLogLevel(LogLevel level) { gLevel.store(static_cast<int>(level)); }
LogLevel logLevel() { return static_cast<LogLevel>(gLevel.load()); }

LogLevel parseLogLevel(const std::string& given) {
  std::string text = given;  // DEBUG as debug
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warning" || text == "warn") return LogLevel::kWarning;
  if (text == "error") return LogLevel::kError;
  if (text == "off") return LogLevel::kOff;
  throw InvalidArgument("unknown log level '" + given +
                        "' (expected debug, info, warning, error or off)");
}

void setLogLevelFromEnvironment() {
  const char* level = std::getenv("POSEIDON_LOG");
  if (!level || !*level) return;
  try {
    setLogLevel(parseLogLevel(level));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(strCat("POSEIDON_LOG: ", e.what()));
  }
}

void setLogPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(gPrefixMutex);
  gPrefix = prefix;
}

LogLine::~LogLine() {
  static const char* kNames[] = {"debug", "info", "warning", "error", "off"};
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(gPrefixMutex);
    prefix = gPrefix;
  }
  std::string message = os_.str();
  // Errors that name their rank ("rank 1: lost rank 0 ...", thrown by the
  // core and logged as well) would repeat the line's own prefix; drop it.
  const std::string own = prefix + ": ";
  if (message.compare(0, own.size(), own) == 0) message.erase(0, own.size());
  std::string line = "[" + prefix + "] " + kNames[static_cast<int>(level_)] + ": " + message + "\n";
  // One write() per line so lines from several threads do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace poseidon
