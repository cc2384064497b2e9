// Child processes: the one place that forks and execs. Used by the local
// launcher (poseidon launch / train: ranks with piped, rank-prefixed output),
// by poseidon bench (ranks inside a node's network namespace, output to a log
// file) and by bench::run (ip, tc, gnuplot: output captured, then checked).
//
// Every child gets this process's environment with SpawnOptions::env set on
// top (environmentWith), SIGINT and SIGTERM back at their defaults (the
// supervisors catch them to stop their children in order), and no pipe ends
// of other children: every descriptor made here is close-on-exec.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace poseidon {

// Where a child's stdout or stderr goes.
enum class Output {
  kInherit,     // this process's own
  kPipe,        // a pipe this process reads (ChildProcess::stdoutFd / stderrFd)
  kFile,        // SpawnOptions::file, created or truncated
  kLikeStdout,  // stderr only: the same pipe or file as stdout, interleaved as written
};

struct SpawnOptions {
  std::vector<std::string> argv;            // argv[0] is looked up on PATH
  std::map<std::string, std::string> env;   // set on top of this process's environment
  Output stdoutTo = Output::kInherit;
  Output stderrTo = Output::kInherit;
  std::string file;                         // for Output::kFile
  // Run inside this network namespace. Through `ip netns exec` rather than
  // setns(): it also mounts the namespace's /sys, where bench-worker reads
  // its interface's byte counters.
  std::string netns;
  // Its own process group, so that kill() also reaches whatever the child
  // started (and a Ctrl-C at the terminal reaches only the supervisor, which
  // then stops its children in order).
  bool ownProcessGroup = false;
  // > 0: the child's timer slack (prctl PR_SET_TIMERSLACK; inherited by its threads and kept
  // across exec), how late the kernel may wake a sleeping thread to batch wake-ups. The default,
  // 50 us, makes each sleep_until 70-75 us late on the development VM (14-23 us at 1 ns): the
  // emulated cluster's ranks, which charge work by sleeping, ask for 1 ns. 0: inherited.
  unsigned long timerSlackNs = 0;
  // The child gets SIGTERM when this process dies (prctl PR_SET_PDEATHSIG), even by SIGKILL. The
  // kernel sends it when the thread that forked exits: spawn from a thread that outlives the child.
  bool dieWithParent = false;
};

class ChildProcess {
 public:
  // Forks and execs; throws IoError when the pipes, the file or fork() fail.
  // A program that cannot be executed exits with code 127 after writing
  // "cannot run 'PROGRAM': REASON" to its stderr.
  static ChildProcess spawn(const SpawnOptions& options);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Closes the pipes. Does not wait for or kill the child: its supervisor does.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // Read ends of Output::kPipe streams; -1 when not piped or closed.
  int stdoutFd() const { return stdoutFd_; }
  int stderrFd() const { return stderrFd_; }
  void closeStdout();
  void closeStderr();

  // Reaps the child if it has exited, without blocking; true once it has.
  bool poll();
  // Blocks until the child has exited; returns its wait status.
  int wait();
  bool exited() const { return exited_; }
  int status() const { return status_; }  // waitpid status, once exited()
  // Sends sig to the child (and to its process group when it has its own); nothing once it has been
  // reaped.
  void kill(int sig) const;
  // Sends sig to the child's own process group, also after the child was reaped: what it started and
  // left running. Once the group is empty its id may pass to another process's group, so call it right
  // after the reap, or while a member is known to live (it holds the child's pipe).
  void killGroup(int sig) const;

 private:
  pid_t pid_ = -1;
  int stdoutFd_ = -1, stderrFd_ = -1;
  bool ownGroup_ = false;
  bool exited_ = false;
  int status_ = 0;
};

// Runs argv to completion with stdout and stderr captured together.
struct CommandResult {
  int status = 0;      // waitpid status
  std::string output;  // stdout and stderr, interleaved
  bool ok() const;     // exited with code 0
};
CommandResult runCommand(const std::vector<std::string>& argv);

// "exited with code 3", "was killed by signal 9 (Killed)".
std::string describeExit(int status);

// Writes all of s to fd (retrying short writes and EINTR); gives up silently
// when the descriptor is gone (a closed terminal must not stop a supervisor).
// The (data, size) form allocates nothing, so a forked child may use it.
void writeAll(int fd, const std::string& s);
void writeAll(int fd, const char* data, size_t size);

}  // namespace poseidon
