#include "poseidon/launch/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "poseidon/common/error.h"
#include "poseidon/launch/env.h"

namespace poseidon {
namespace {

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The two ends of a close-on-exec pipe; closes what is left on the way out.
struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(strCat("pipe(): ", std::strerror(errno)));
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    closeFd(read);
    closeFd(write);
  }
};

}  // namespace

ChildProcess ChildProcess::spawn(const SpawnOptions& options) {
  if (options.argv.empty()) throw InvalidArgument("no program to run");
  if (options.stdoutTo == Output::kLikeStdout) throw InvalidArgument("stdout cannot go where stdout goes");
  // Everything the child needs is prepared before fork(): between fork and
  // exec it only moves descriptors around (the parent may have threads).
  std::vector<std::string> argv;
  if (!options.netns.empty()) argv = {"ip", "netns", "exec", options.netns};
  argv.insert(argv.end(), options.argv.begin(), options.argv.end());
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> envStrings = environmentWith(options.env);
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string cannotRun = strCat("cannot run '", argv[0], "': ");

  std::unique_ptr<Pipe> outPipe, errPipe;
  if (options.stdoutTo == Output::kPipe) outPipe = std::make_unique<Pipe>();
  if (options.stderrTo == Output::kPipe) errPipe = std::make_unique<Pipe>();
  int fileFd = -1;
  if (options.stdoutTo == Output::kFile || options.stderrTo == Output::kFile) {
    fileFd = ::open(options.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fileFd < 0) throw IoError(strCat("cannot write ", options.file, ": ", std::strerror(errno)));
  }
  auto target = [&](Output o, const std::unique_ptr<Pipe>& p) {
    return o == Output::kPipe ? p->write : o == Output::kFile ? fileFd : -1;
  };
  const int outTarget = target(options.stdoutTo, outPipe);
  const int errTarget = options.stderrTo == Output::kLikeStdout ? -2 : target(options.stderrTo, errPipe);

  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    if (fileFd >= 0) ::close(fileFd);
    throw IoError(strCat("fork(): ", std::strerror(err)));
  }
  if (pid == 0) {
    if (outTarget >= 0) ::dup2(outTarget, STDOUT_FILENO);
    if (errTarget >= 0) ::dup2(errTarget, STDERR_FILENO);
    if (errTarget == -2) ::dup2(STDOUT_FILENO, STDERR_FILENO);
    if (options.ownProcessGroup) ::setpgid(0, 0);
    if (options.timerSlackNs > 0) ::prctl(PR_SET_TIMERSLACK, options.timerSlackNs, 0, 0, 0);
    if (options.dieWithParent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
      if (::getppid() != parent) ::_exit(128 + SIGTERM);  // it died before the prctl
    }
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execvpe(args[0], args.data(), envp.data());
    const char* why = std::strerror(errno);
    writeAll(STDERR_FILENO, cannotRun.data(), cannotRun.size());
    writeAll(STDERR_FILENO, why, std::strlen(why));
    writeAll(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  if (fileFd >= 0) ::close(fileFd);
  // Both sides set the group, so that a kill() right after spawn reaches it too.
  if (options.ownProcessGroup) ::setpgid(pid, pid);
  ChildProcess child;
  child.pid_ = pid;
  child.ownGroup_ = options.ownProcessGroup;
  if (outPipe) std::swap(child.stdoutFd_, outPipe->read);
  if (errPipe) std::swap(child.stderrFd_, errPipe->read);
  return child;  // the write ends close with the pipes: only the child holds them now
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    closeStdout();
    closeStderr();
    pid_ = other.pid_;
    stdoutFd_ = other.stdoutFd_;
    stderrFd_ = other.stderrFd_;
    ownGroup_ = other.ownGroup_;
    exited_ = other.exited_;
    status_ = other.status_;
    other.pid_ = -1;
    other.stdoutFd_ = other.stderrFd_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  closeStdout();
  closeStderr();
}

void ChildProcess::closeStdout() { closeFd(stdoutFd_); }
void ChildProcess::closeStderr() { closeFd(stderrFd_); }

bool ChildProcess::poll() {
  if (exited_ || pid_ < 0) return exited_;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    exited_ = true;
    status_ = status;
  }
  return exited_;
}

int ChildProcess::wait() {
  if (exited_ || pid_ < 0) return status_;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) throw IoError(strCat("waitpid(", pid_, "): ", std::strerror(errno)));
  }
  exited_ = true;
  status_ = status;
  return status_;
}

void ChildProcess::kill(int sig) const {
  if (exited_ || pid_ < 0) return;
  if (ownGroup_) ::kill(-pid_, sig);
  ::kill(pid_, sig);
}

void ChildProcess::killGroup(int sig) const {
  if (pid_ >= 0 && ownGroup_) ::kill(-pid_, sig);
}

bool CommandResult::ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

CommandResult runCommand(const std::vector<std::string>& argv) {
  SpawnOptions o;
  o.argv = argv;
  o.stdoutTo = Output::kPipe;
  o.stderrTo = Output::kLikeStdout;
  ChildProcess child = ChildProcess::spawn(o);
  CommandResult r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(child.stdoutFd(), buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) r.output.append(buf, static_cast<size_t>(n));
  }
  child.closeStdout();
  r.status = child.wait();
  return r;
}

std::string describeExit(int status) {
  if (WIFEXITED(status)) return strCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return strCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

void writeAll(int fd, const std::string& s) { writeAll(fd, s.data(), s.size()); }

void writeAll(int fd, const char* data, size_t size) {
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::write(fd, data + off, size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace poseidon
