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

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

// Waits for every process until the deadline; kills the rest.
inline void waitAll(std::vector<Proc>& procs, std::chrono::seconds timeout) {
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + timeout;
  size_t left = procs.size();
  while (left > 0) {
    for (auto& p : procs) {
      if (p.status != -1 || p.killed) continue;
      int st;
      if (waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.status = st;
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (auto& p : procs) {
        if (p.status != -1) continue;
        kill(p.pid, SIGKILL);
        waitpid(p.pid, &p.status, 0);
        p.killed = true;
        --left;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Polls `ready` (every 20 ms) until it holds or `deadline` has passed; returns whether it holds. The
// deadline comes from the configured timeout of whatever the test waits for: past it, that job has
// given up itself, so waiting longer cannot help.
inline bool waitFor(const std::function<bool()>& ready, std::chrono::milliseconds deadline) {
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
