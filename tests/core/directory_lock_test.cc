// DirectoryLock (common/file.h) when the lock file is read-only to its user: a group-writable
// checkpoint directory whose lock file another user created (0644 under the usual umask). flock needs
// no write access, so that user still locks and is still refused by name; what it cannot do is write
// its own holder line, so a job it refuses must not be told the earlier holder's.
//
// The other user is a forked child: as root (CI) it becomes nobody, since root's opens ignore file
// modes; otherwise the file's mode 0444 makes it read-only to this user too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

// A directory others may enter, holding a lock file read-only to them, whose line names "job A".
std::string sharedDirWithJobAsLine() {
  char name[] = "/tmp/poseidon-lock-XXXXXX";
  EXPECT_NE(::mkdtemp(name), nullptr);
  const std::string dir = name;
  ::chmod(dir.c_str(), 0755);
  { DirectoryLock a(dir, "checkpoint directory", "job A (a test)"); }
  EXPECT_EQ(::chmod((dir + "/" + DirectoryLock::kFileName).c_str(), 0444), 0);
  return dir;
}

void writeAll(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string readLine(int fd) {
  std::string out;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != '\n') out += c;
  return out;
}

// Forks the other user. `other(toParent, fromParent)` runs as it; what it writes to toParent the
// parent reads with readLine. Returns the child's pid; the caller waits for it.
pid_t forkOtherUser(int pipes[2][2], const std::function<void(int, int)>& other) {
  EXPECT_EQ(::pipe(pipes[0]), 0);  // child -> parent
  EXPECT_EQ(::pipe(pipes[1]), 0);  // parent -> child
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipes[0][0]);
    ::close(pipes[1][1]);
    if (::geteuid() == 0 && (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)) {
      writeAll(pipes[0][1], "cannot become nobody\n");
      std::_Exit(1);
    }
    other(pipes[0][1], pipes[1][0]);
    std::_Exit(0);
  }
  ::close(pipes[0][1]);
  ::close(pipes[1][0]);
  return pid;
}

void expectCleanExit(pid_t pid) {
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(DirectoryLock, AUserWhoCanOnlyReadTheLockFileIsRefusedNamingTheHolder) {
  const std::string dir = sharedDirWithJobAsLine();
  DirectoryLock jobA(dir, "checkpoint directory", "job A (a test)");  // root (or this user) again
  int pipes[2][2];
  const pid_t pid = forkOtherUser(pipes, [&](int toParent, int) {
    try {
      DirectoryLock jobB(dir, "checkpoint directory", "job B");
      writeAll(toParent, "took the lock\n");
    } catch (const InvalidArgument& e) {
      writeAll(toParent, std::string(e.what()) + "\n");
    } catch (const std::exception& e) {  // without the read-only open: "cannot open ...: Permission denied"
      writeAll(toParent, std::string("not refused by name: ") + e.what() + "\n");
    }
  });
  const std::string said = readLine(pipes[0][0]);
  EXPECT_THAT(said, HasSubstr("checkpoint directory " + dir + " is in use by job A (a test), pid " +
                              std::to_string(::getpid()) + " on "));
  ::close(pipes[0][0]);
  ::close(pipes[1][1]);
  expectCleanExit(pid);
  fs::remove_all(dir);
}

TEST(DirectoryLock, AHolderThatCouldNotWriteItsLineIsNotCalledByTheEarlierOnesName) {
  const std::string dir = sharedDirWithJobAsLine();
  int pipes[2][2];
  const pid_t pid = forkOtherUser(pipes, [&](int toParent, int fromParent) {
    try {
      DirectoryLock jobB(dir, "checkpoint directory", "job B");  // read-only: "job A" stays in the file
      writeAll(toParent, "took the lock\n");
      readLine(fromParent);  // held until the parent has been refused
    } catch (const std::exception& e) {
      writeAll(toParent, std::string("refused: ") + e.what() + "\n");
    }
  });
  ASSERT_EQ(readLine(pipes[0][0]), "took the lock");
  const std::string expected = "checkpoint directory " + dir + " is in use by another process, pid " +
                               std::to_string(pid) + " (it holds " + dir + "/" + DirectoryLock::kFileName + ")";
  try {
    DirectoryLock jobC(dir, "checkpoint directory", "job C");
    ADD_FAILURE() << "job C took a lock that job B holds";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(expected));
    EXPECT_THAT(e.what(), Not(HasSubstr("job A")));
  }
  try {
    DirectoryLock::checkFree(dir, "checkpoint directory");
    ADD_FAILURE() << "checkFree found held lock free";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(expected));
  }
  writeAll(pipes[1][1], "done\n");
  ::close(pipes[0][0]);
  ::close(pipes[1][1]);
  expectCleanExit(pid);
  DirectoryLock jobD(dir, "checkpoint directory", "job D");  // released with job B's exit
  fs::remove_all(dir);
}

}  // namespace
}  // namespace poseidon
