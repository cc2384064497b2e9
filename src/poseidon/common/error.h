// Error family for Poseidon's synchronous APIs (gloo-style).
//
// Contract: every error a user can cause (bad flag, unreachable coordinator,
// mismatched model, malformed message, timeout) is thrown as one of these with
// a message that says what happened and what to do. Callbacks and the receive
// loop never throw across threads; they record the error and the next
// synchronous call rethrows it (sticky failure, see docs/errors.md).
#pragma once

#include <chrono>
#include <sstream>
#include <stdexcept>
#include <string>

namespace poseidon {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The caller passed something invalid (flag, option, shape, file).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A wait ran past its deadline. The message names what was missing.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The transport failed (bind, connect, send).
class IoError : public Error {
 public:
  using Error::Error;
};

// A command that catches SIGINT, SIGTERM, SIGHUP or SIGPIPE to clean up first (poseidon bench, tune) was
// stopped by one: main exits 128 + signal(), the status a shell gives a process the signal killed.
class InterruptedError : public Error {
 public:
  InterruptedError(const std::string& what, int signal) : Error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// A peer sent something that does not follow the protocol.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The job was aborted: a peer failed or was lost. Sticky.
class AbortedError : public Error {
 public:
  using Error::Error;
};

// Training diverged: a synchronized gradient (or, with compute groups, the model pulled from the
// shards) is not finite. In a BSP job every rank holds the same mean gradient, so every rank throws
// it at the same step, with no message between them. step(): the job's step, counted from 1;
// subject(): what was not finite ("the mean gradient of layer 'ip1'").
class DivergenceError : public Error {
 public:
  DivergenceError(const std::string& what, long long step, std::string subject)
      : Error(what), step_(step), subject_(std::move(subject)) {}
  long long step() const { return step_; }
  const std::string& subject() const { return subject_; }

 private:
  long long step_;
  std::string subject_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Builds a message from any streamable arguments.
template <typename... Args>
std::string strCat(const Args&... args) {
  return detail::concat(args...);
}

// A wait's length in a message, to a tenth of a second: "6.7 s", "30 s" ("40 ms" below 0.1 s). The
// node's waits add two heartbeats to the timeout, so that a lost peer is named first: a 5 s timeout
// waited 6.666 s, and said so to the millisecond.
inline std::string secondsText(std::chrono::milliseconds wait) {
  if (wait.count() < 100) return strCat(wait.count(), " ms");
  const long long tenths = (static_cast<long long>(wait.count()) + 50) / 100;
  return tenths % 10 == 0 ? strCat(tenths / 10, " s") : strCat(tenths / 10, ".", tenths % 10, " s");
}

}  // namespace poseidon

// Internal invariant checks: throw poseidon::Error naming file:line.
#define POSEIDON_ENFORCE(cond, ...)                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      throw ::poseidon::Error(::poseidon::strCat(__FILE__, ":", __LINE__, ": ",      \
                                                 "check failed: " #cond " ",         \
                                                 ##__VA_ARGS__));                    \
    }                                                                                \
  } while (0)

#define POSEIDON_ENFORCE_EQ(a, b, ...)                                               \
  do {                                                                               \
    const auto& poseidon_a_ = (a);                                                   \
    const auto& poseidon_b_ = (b);                                                   \
    if (!(poseidon_a_ == poseidon_b_)) {                                             \
      throw ::poseidon::Error(::poseidon::strCat(__FILE__, ":", __LINE__, ": ",      \
                                                 #a " == " #b " failed (", poseidon_a_, \
                                                 " vs ", poseidon_b_, ") ",          \
                                                 ##__VA_ARGS__));                    \
    }                                                                                \
  } while (0)
