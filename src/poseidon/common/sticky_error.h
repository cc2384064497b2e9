// StickyError: the first failure of a node, kept with its type (gloo's sticky
// failure). Once set, every later synchronous call rethrows it: a
// TimeoutError stays a TimeoutError, an AbortedError an AbortedError.
//
// Threads: any. set() takes a private mutex that is a leaf of the lock order
// (nothing is locked while it is held), so it may be called with any other
// lock held; the owner does the side effects (logging, telling peers,
// waking waiters) after set() returns true, outside its own locks.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>
#include <string>

namespace poseidon {

class StickyError {
 public:
  // Records `error` if no error was recorded yet; returns whether it was.
  bool set(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_) return false;
    first_ = std::move(error);
    failed_.store(true, std::memory_order_release);
    return true;
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::exception_ptr get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }
  // Rethrows the recorded error, if any.
  void check() const {
    if (!failed()) return;
    std::rethrow_exception(get());
  }
  // The recorded error's message ("" while healthy).
  std::string message() const {
    std::exception_ptr e = get();
    if (!e) return {};
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "unknown error";
    }
  }

 private:
  mutable std::mutex mutex_;
  std::exception_ptr first_;
  std::atomic<bool> failed_{false};
};

}  // namespace poseidon
