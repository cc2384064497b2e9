// Waiting for events in tests, up to a deadline, without waking on a timer: a process's exit (a
// pidfd, readable once it has exited) and a change in a directory (inotify: a file created, written,
// closed, renamed or removed). Header-only, so that the test node binary can use it too.
#pragma once

#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace poseidon::testing {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline` for poll(): 0 once it has passed, rounded up so that a wait does
// not end a fraction of a millisecond early and spin.
inline int millisecondsLeft(Deadline deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// A pidfd for `pid` (Linux >= 5.3): poll() reports it readable once the process has exited, whether or
// not it is our child. -1 with errno ESRCH when no such process exists any more.
inline int openPidfd(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Waits until poll() reports one of `fds` readable or `deadline` passes; returns poll()'s count (0 at
// the deadline). EINTR is not an event: the wait goes on.
inline int pollReadable(std::vector<pollfd>& fds, Deadline deadline) {
  for (auto& p : fds) p.events = POLLIN, p.revents = 0;
  for (;;) {
    const int n = ::poll(fds.data(), fds.size(), millisecondsLeft(deadline));
    if (n >= 0) return n;
    if (errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
  }
}

// Checks `ready` whenever something changes in one of `dirs` (watched before the first check, so a
// change between the check and the wait is not lost) until it holds or `deadline` passes; returns
// whether it holds. For state that lives in files: a process's log, a file another process writes.
inline bool waitForChange(const std::vector<std::string>& dirs, const std::function<bool()>& ready, Deadline deadline) {
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("inotify_init1: ") + std::strerror(errno));
  for (const auto& d : dirs)
    if (::inotify_add_watch(fd, d.c_str(), IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE) < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error("cannot watch " + d + ": " + why);
    }
  bool held = ready();
  std::vector<pollfd> fds{{fd, POLLIN, 0}};
  while (!held && pollReadable(fds, deadline) > 0) {
    alignas(inotify_event) char buf[4096];
    while (::read(fd, buf, sizeof buf) > 0) {
    }  // what changed does not matter: `ready` says whether it was the change waited for
    held = ready();
  }
  ::close(fd);
  return held || ready();
}

// The directory part of `path` ("." for a bare name).
inline std::string directoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace poseidon::testing
