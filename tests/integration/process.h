// Spawning real processes from tests: each child gets its own environment
// and its stdout/stderr in files, and every wait is bounded (a child still
// running at the deadline is SIGKILLed and reported as such).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "events.h"

namespace poseidon::testing {

extern "C" char** environ;

struct Proc {
  pid_t pid = -1;
  std::string out, err;  // file paths
  int status = -1;
  bool killed = false;   // did not finish in time
  double seconds = 0;
  int exitCode() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
  std::string stderrText() const {
    std::ifstream f(err);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string stdoutText() const {
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

inline Proc spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extraEnv,
                  const std::string& logPrefix) {
  Proc p;
  p.out = logPrefix + ".out";
  p.err = logPrefix + ".err";
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const char* k : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    env.erase(k);
  for (const auto& [k, v] : extraEnv) env[k] = v;
  std::vector<std::string> envStrings;
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (auto& s : envStrings) envp.push_back(s.data());
    envp.push_back(nullptr);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  p.pid = pid;
  return p;
}

// Waits for every process until the deadline (each exit is an event: its pidfd turns readable);
// kills the rest.
inline void waitAll(std::vector<Proc>& procs, std::chrono::seconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  std::vector<pollfd> fds;
  std::vector<Proc*> waiting;
  for (auto& p : procs) {
    if (p.status != -1 || p.killed) continue;
    const int fd = openPidfd(p.pid);
    if (fd < 0) throw std::runtime_error("pidfd_open(" + std::to_string(p.pid) + "): " + std::strerror(errno));
    fds.push_back({fd, POLLIN, 0});
    waiting.push_back(&p);
  }
  while (!waiting.empty() && pollReadable(fds, deadline) > 0) {
    for (size_t i = 0; i < waiting.size();) {
      int st;
      if ((fds[i].revents & POLLIN) && waitpid(waiting[i]->pid, &st, WNOHANG) == waiting[i]->pid) {
        waiting[i]->status = st;
        waiting[i]->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        ::close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
        waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  for (size_t i = 0; i < waiting.size(); ++i) {  // past the deadline
    kill(waiting[i]->pid, SIGKILL);
    waitpid(waiting[i]->pid, &waiting[i]->status, 0);
    waiting[i]->killed = true;
    ::close(fds[i].fd);
  }
}

// Checks `ready` whenever a file in one of `dirs` changes (events.h), until it holds or `deadline`
// has passed; returns whether it holds. The deadline comes from the configured timeout of whatever
// the test waits for: past it, that job has given up itself, so waiting longer cannot help.
inline bool waitFor(const std::function<bool()>& ready, std::chrono::milliseconds deadline,
                    const std::vector<std::string>& dirs) {
  return waitForChange(dirs, ready, std::chrono::steady_clock::now() + deadline);
}

// The same for state that no file change announces (the kernel's socket table, its network
// namespaces' processes): re-checked every 20 ms, which is as soon as a test needs to know.
inline bool waitForPolled(const std::function<bool()>& ready, std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

inline std::string makeTempDir(const std::string& tag) {
  std::string tmpl = "/tmp/poseidon-" + tag + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* d = mkdtemp(buf.data());
  return d ? std::string(d) : std::string("/tmp");
}

// Whether something accepts TCP connections on 127.0.0.1:port (a rank 0's coordinator): the event
// tests wait for instead of a head start in time.
inline bool listening(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

}  // namespace poseidon::testing
