#include "poseidon/launch/launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/process.h"
#include "poseidon/transport/security.h"

namespace poseidon {
namespace {

std::atomic<int> gSignal{0};
void onSignal(int sig) { gSignal = sig; }

// What a rank's stderr said last, for the failure report (which names the rank itself).
struct ErrTail {
  std::string last;  // the last line, without its rank marker
  // A Python traceback's closing line ("ValueError: bad label 7"): what the program died of, which
  // the lines after it (the runtime's exit messages) would hide.
  bool inTraceback = false;
  std::string exception;

  void add(const std::string& line) {
    if (line.empty()) return;
    last = line;
    if (line == "Traceback (most recent call last):") inTraceback = true;
    else if (inTraceback && line[0] != ' ') {
      exception = line;  // the first unindented line after the frames
      inTraceback = false;
    }
  }
  const std::string& said() const { return exception.empty() ? last : exception; }
};

struct Rank {
  int rank = 0;
  ChildProcess process;
  std::string outBuf, errBuf;
  ErrTail err;
};

// Emits the complete lines of buf (or everything when flush), each with the
// rank prefix in place of the rank's own marker when `prefixed`, and as the
// rank wrote it otherwise. `keep` gets the lines without their marker.
void forward(std::string& buf, int fd, int rank, bool prefixed, ErrTail* keep, bool flush) {
  auto emit = [&](const std::string& line) {
    std::string own = withoutRankMarker(line, rank);
    writeAll(fd, (prefixed ? rankPrefix(rank) + own : line) + "\n");
    if (keep) keep->add(own);
  };
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    emit(buf.substr(start, nl - start));
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    emit(buf);
    buf.clear();
  }
}

// One launch: the ranks' processes, their output forwarded line by line, and the first failure,
// which stops the others (SIGTERM, then SIGKILL after the grace period).
class Launch {
 public:
  explicit Launch(const LaunchOptions& options)
      : options_(options),
        masterAddr_(resolveHost(options.masterAddr)),
        port_(options.masterPort ? options.masterPort : freePort(masterAddr_)) {}

  void spawn() {
    // The launcher keeps two pipes per rank (four ends while one is started), and its ranks inherit
    // the limit (Van raises its own again for its connections).
    const uint64_t needed = 2 * static_cast<uint64_t>(options_.ranks) + 32;
    const uint64_t limit = raiseDescriptorLimit(needed);
    if (limit < needed) {
      throw InvalidArgument(strCat("-n ", options_.ranks, " needs about ", needed,
                                   " open files (two output pipes per rank) and this process may open ", limit,
                                   " (hard limit ", hardDescriptorLimit(), "): raise it (ulimit -n) or start fewer ranks"));
    }
    children_.resize(options_.ranks);
    try {
      spawnEach();
    } catch (...) {
      // No rank of a job that cannot start is left behind, waiting for the others at rendezvous.
      for (auto& c : children_) c.process.kill(SIGKILL);
      for (auto& c : children_) c.process.wait();
      throw;
    }
  }

  void spawnEach() {
    for (int r = 0; r < options_.ranks; ++r) {
      SpawnOptions so;
      so.argv = options_.command;
      so.env = options_.env;
      so.env["RANK"] = std::to_string(r);
      so.env["WORLD_SIZE"] = std::to_string(options_.ranks);
      so.env["LOCAL_RANK"] = std::to_string(r);
      so.env["LOCAL_WORLD_SIZE"] = std::to_string(options_.ranks);
      so.env["MASTER_ADDR"] = masterAddr_;
      so.env["MASTER_PORT"] = std::to_string(port_);
      so.env["POSEIDON_LAUNCHER"] = options_.name;  // the ranks' messages name it (RankEnv::source)
      so.stdoutTo = Output::kPipe;
      so.stderrTo = Output::kPipe;
      // Each rank leads a process group, so that stopping it also stops what it started: a shell
      // wrapper's training program, a sleep (an audit found both outliving the launch). A Ctrl-C at
      // the terminal then reaches the launcher alone, which stops the ranks (stopAll).
      so.ownProcessGroup = true;
      so.dieWithParent = true;  // a launcher killed outright (SIGKILL) leaves no rank training on alone
      children_[r].rank = r;
      children_[r].process = ChildProcess::spawn(so);
    }
  }

  // Until every rank exited and its pipes closed (or the kill grace after every rank exited: what a
  // rank left running, told to stop then, may hold a pipe open).
  LaunchResult run() {
    auto allExitedSince = std::chrono::steady_clock::time_point::max();
    for (;;) {
      pumpOutput();
      reapExits();
      if (gSignal && !stopping_) {
        result_.failure = strCat("interrupted by ", stopSignalName(gSignal.load()), "; stopped all ranks");
        result_.interrupted = true;
        result_.exitCode = 128 + gSignal.load();
        stopAll();
      }
      if (stopping_ && std::chrono::steady_clock::now() > stopDeadline_) {
        for (auto& c : children_) c.process.kill(SIGKILL);
        stopDeadline_ = std::chrono::steady_clock::time_point::max();
      }
      bool allDone = true, allExited = true;
      for (auto& c : children_) {
        allDone = allDone && c.process.exited() && c.process.stdoutFd() < 0 && c.process.stderrFd() < 0;
        allExited = allExited && c.process.exited();
      }
      if (allExited && allExitedSince == std::chrono::steady_clock::time_point::max())
        allExitedSince = std::chrono::steady_clock::now();
      if (allDone) break;
      if (allExited && std::chrono::steady_clock::now() - allExitedSince > options_.killGrace) {
        // What a rank left running ignored the SIGTERM it got when the rank exited (reapExits) and
        // still holds the rank's pipe, so its group has a member: the id is still that group's.
        for (auto& c : children_)
          if (c.process.stdoutFd() >= 0 || c.process.stderrFd() >= 0) c.process.killGroup(SIGKILL);
        break;
      }
    }
    if (result_.failedRank >= 0) {
      const Rank& c = children_[result_.failedRank];
      if (const std::string said = c.err.said(); !said.empty()) result_.failure += ": " + said;
    }
    return result_;
  }

 private:
  // SIGTERM to every rank now; SIGKILL once the grace period is over.
  void stopAll() {
    stopping_ = true;
    stopDeadline_ = std::chrono::steady_clock::now() + options_.killGrace;
    // A stopped rank (SIGSTOP, a debugger let go) acts on SIGTERM only once it runs again: without the
    // SIGCONT the job's end waited the whole grace for the SIGKILL.
    for (auto& c : children_) {
      c.process.kill(SIGTERM);
      c.process.kill(SIGCONT);
    }
  }

  // Waits up to 100 ms for output and forwards what came.
  void pumpOutput() {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;  // child index, is stderr
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i].process.stdoutFd() >= 0) {
        fds.push_back({children_[i].process.stdoutFd(), POLLIN, 0});
        who.push_back({static_cast<int>(i), false});
      }
      if (children_[i].process.stderrFd() >= 0) {
        fds.push_back({children_[i].process.stderrFd(), POLLIN, 0});
        who.push_back({static_cast<int>(i), true});
      }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    else usleep(20000);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& c = children_[who[k].first];
      bool isErr = who[k].second;
      char buf[65536];
      ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
      std::string& acc = isErr ? c.errBuf : c.outBuf;
      const bool prefixed = c.rank != 0 || options_.prefixRank0;
      const int fd = isErr ? STDERR_FILENO : STDOUT_FILENO;
      if (n > 0) {
        acc.append(buf, static_cast<size_t>(n));
        forward(acc, fd, c.rank, prefixed, isErr ? &c.err : nullptr, false);
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        forward(acc, fd, c.rank, prefixed, isErr ? &c.err : nullptr, true);
        if (isErr) c.process.closeStderr();
        else c.process.closeStdout();
      }
    }
  }

  // Records the first rank that failed and stops the rest (unless it finished with one of
  // finishedCodes: then a later failure stops them).
  void reapExits() {
    for (auto& c : children_) {
      if (c.process.exited() || !c.process.poll()) continue;
      // What the rank started and left running (a shell's background job) stops with it, now, while its
      // group's id cannot have passed to another process yet.
      c.process.killGroup(SIGTERM);
      c.process.killGroup(SIGCONT);
      const int status = c.process.status();
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      const bool finished = WIFEXITED(status) && std::count(options_.finishedCodes.begin(),
                                                            options_.finishedCodes.end(), WEXITSTATUS(status)) > 0;
      if (!ok && result_.failedRank < 0 && !stopping_) {
        result_.failedRank = c.rank;
        result_.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        result_.failure = strCat("rank ", c.rank, " ", describeExit(status));
        result_.finished = finished;
        if (!finished) stopAll();
      } else if (!ok && !finished && result_.finished && !stopping_) {
        stopAll();  // a rank that failed otherwise after one finished with such a code
      }
    }
  }

  const LaunchOptions& options_;
  const std::string masterAddr_;
  const int port_;
  std::vector<Rank> children_;
  LaunchResult result_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stopDeadline_ = std::chrono::steady_clock::time_point::max();
};

// SIGINT, SIGTERM and SIGHUP (the terminal or the ssh session closed: the ranks, each in a process
// group of its own, do not get it) recorded in gSignal, so that the launch stops every rank, while
// it lives.
class SignalsCaught {
 public:
  SignalsCaught() {
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) {
      sigaction(kSignals[i], nullptr, &old_[i]);
      // Ignored is the user's choice (nohup ignores SIGHUP; a background job, SIGINT): it stays so.
      if (old_[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, nullptr);
    }
    gSignal = 0;
  }
  ~SignalsCaught() {
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  SignalsCaught(const SignalsCaught&) = delete;
  SignalsCaught& operator=(const SignalsCaught&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

LaunchResult launchOnce(const LaunchOptions& options) {
  Launch launch(options);
  SignalsCaught signals;
  launch.spawn();
  return launch.run();
}

bool readProgress(const std::string& path, long long* iteration, long long* checkpoint) {
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (!f || j.is_discarded() || !j.is_object()) return false;
  *iteration = j.value("iteration", -1LL);
  *checkpoint = j.value("checkpoint_iteration", -1LL);
  return *iteration >= 0;
}

}  // namespace

std::string rankPrefix(int rank) { return strCat("[rank ", rank, "] "); }

std::string withoutRankMarker(const std::string& line, int rank) {
  std::string rest = line;
  for (const std::string& marker : {rankPrefix(rank), strCat("rank ", rank, ": ")}) {
    if (rest.compare(0, marker.size(), marker) == 0) rest.erase(0, marker.size());
  }
  return rest;
}

std::string stopSignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return strCat("signal ", sig);
  }
}

LaunchResult launchLocal(const LaunchOptions& options) {
  if (options.ranks < 1) throw InvalidArgument(strCat("-n must be at least 1, got ", options.ranks));
  if (options.command.empty()) throw InvalidArgument("no command to launch (usage: poseidon launch -n N -- CMD ...)");
  if (options.maxRestarts < 0) throw InvalidArgument(strCat("--max-restarts must be >= 0, got ", options.maxRestarts));
  // Progress reports are read only to say what a restart lost: without restarts, the ranks
  // are not asked to write them (rank 0 would rewrite the file every step for nothing).
  char dir[] = "/tmp/poseidon-launch-XXXXXX";
  if (options.maxRestarts > 0 && !mkdtemp(dir)) throw IoError("cannot create a directory in /tmp");
  const std::string progress = options.maxRestarts > 0 ? std::string(dir) + "/progress.json" : "";
  LaunchResult result;
  // The ranks prove membership with a job secret; make one for them if the
  // user did not provide one (POSEIDON_SECRET / POSEIDON_SECRET_FILE pass through).
  LaunchOptions withSecret = options;
  if (!withSecret.env.count("POSEIDON_SECRET") && jobSecretFromEnvironment().empty()) {
    withSecret.env["POSEIDON_SECRET"] = randomSecret();
  }
  int portRetries = 0;
  for (int attempt = 0;; ++attempt) {
    LaunchOptions run = withSecret;
    run.env["POSEIDON_RESTART_COUNT"] = std::to_string(attempt);
    if (!progress.empty()) run.env["POSEIDON_PROGRESS_FILE"] = progress;
    if (attempt > 0) run.masterPort = 0;  // a fresh port: the old one may linger in TIME_WAIT
    result = launchOnce(run);
    // A port this launcher picked (freePort) can be taken by another process between the pick and
    // rank 0's bind: the launcher's own race, not the job's failure. A fresh port, up to twice,
    // without counting a restart.
    if (options.masterPort == 0 && portRetries < 2 && result.exitCode != 0 && !result.interrupted &&
        result.failure.find("cannot start the coordinator") != std::string::npos &&
        result.failure.find("Address already in use") != std::string::npos) {
      ++portRetries;
      --attempt;
      writeAll(STDERR_FILENO, strCat(options.name,
                                     ": the coordinator's port was taken before rank 0 bound it; "
                                     "starting again on a fresh port\n"));
      continue;
    }
    if (result.exitCode == 0 || result.interrupted || result.finished || attempt >= options.maxRestarts) break;
    if (result.exitCode == 2 || result.exitCode == 126 || result.exitCode == 127) {
      // A usage error (bad flags, a configuration the ranks refuse), or a program that could not be
      // run at all (ChildProcess::spawn's 127, a shell's 126/127): the same arguments fail again.
      writeAll(STDERR_FILENO,
               strCat(options.name, ": ", result.failure, "; not restarted: exit code ", result.exitCode,
                      result.exitCode == 2 ? " is a usage error" : " means the program could not be run",
                      ", which a restart would repeat\n"));
      break;
    }
    long long it = -1, ckpt = -1;
    std::string lost;
    if (readProgress(progress, &it, &ckpt)) {
      lost = ckpt >= 0 ? strCat("failed at iteration ", it, "; restarting from the checkpoint at iteration ", ckpt, " (",
                                it - ckpt, " iteration", it - ckpt == 1 ? "" : "s", " lost)")
                       : strCat("failed at iteration ", it, " with no checkpoint; restarting from the beginning (", it,
                                " iterations lost)");
    } else {
      lost = "failed before any progress was reported; restarting";
    }
    std::string msg = strCat(options.name, ": ", result.failure, "; job ", lost, ", restart ", attempt + 1, " of ",
                             options.maxRestarts, "\n");
    writeAll(STDERR_FILENO, msg);
  }
  if (!progress.empty()) {
    std::remove(progress.c_str());
    rmdir(dir);
  }
  return result;
}

}  // namespace poseidon
