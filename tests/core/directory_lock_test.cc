// DirectoryLock (common/file.h) when the lock file is read-only to its user: a group-writable
// checkpoint directory whose lock file another user created (0644 under the usual umask). flock needs
// no write access on a local file system, so that user still locks and is still refused by name; what
// it cannot do is write its own holder line, so a job it refuses must not be told the earlier holder's.
// A line another tool wrote for its own lock stays the holder's words.
//
// The other user is a forked child: as root (CI) it becomes nobody, since root's opens ignore file
// modes; otherwise the file's mode 0444 makes it read-only to this user too.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/launch/process.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;
constexpr const char* kCannotBecomeNobody = "cannot become nobody";

// A directory others may enter, removed with this object.
struct SharedDir {
  std::string path;
  SharedDir() {
    char name[] = "/tmp/poseidon-lock-XXXXXX";
    if (::mkdtemp(name) == nullptr) throw IoError("mkdtemp failed");
    path = name;
    ::chmod(path.c_str(), 0755);
  }
  ~SharedDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string lockFile() const { return path + "/" + DirectoryLock::kFileName; }
};

// Does /proc/locks list this process's flock on `file` (device and inode as fstat gives them)? Not on
// every file system (btrfs subvolumes report another device; NFS lists POSIX locks): there the
// refusal keeps the file's line, and the test that needs the listing is skipped.
bool procLocksListsAFlockOn(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool listed = false;
  if (::fstat(fd, &st) == 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    char device[64];  // as the kernel prints it: " FLOCK ... PID MAJ:MIN:INODE "
    std::snprintf(device, sizeof device, " %d %02x:%02x:%llu ", static_cast<int>(::getpid()), major(st.st_dev),
                  minor(st.st_dev), static_cast<unsigned long long>(st.st_ino));
    std::ifstream in("/proc/locks");
    for (std::string line; std::getline(in, line);)
      if (line.find(" FLOCK ") != std::string::npos && line.find(device) != std::string::npos) listed = true;
  }
  ::close(fd);
  return listed;
}

std::string readLine(int fd) {
  std::string out;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != '\n') out += c;
  return out;
}

// The other user, forked: `other(toParent, fromParent)` runs as it, and what it writes to toParent the
// parent reads with readLine. The child's first line is kCannotBecomeNobody when root could not
// become nobody (no CAP_SETUID, an unmapped uid): the caller skips then.
struct OtherUser {
  pid_t pid = -1;
  int fromChild = -1, toChild = -1;
  explicit OtherUser(const std::function<void(int, int)>& other) {
    int up[2], down[2];
    if (::pipe2(up, O_CLOEXEC) != 0 || ::pipe2(down, O_CLOEXEC) != 0) throw IoError("pipe failed");
    pid = ::fork();
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      if (::geteuid() == 0 &&
          (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)) {
        writeAll(up[1], std::string(kCannotBecomeNobody) + "\n");
        std::_Exit(1);
      }
      other(up[1], down[0]);
      std::_Exit(0);
    }
    ::close(up[1]);
    ::close(down[0]);
    fromChild = up[0];
    toChild = down[1];
  }
  // Closes the pipes (a child still waiting for the parent's word then reads end of file) and reaps
  // the child: its exit status.
  int finish() {
    if (fromChild >= 0) ::close(std::exchange(fromChild, -1));
    if (toChild >= 0) ::close(std::exchange(toChild, -1));
    int status = 0;
    if (pid > 0 && ::waitpid(std::exchange(pid, -1), &status, 0) < 0) return -1;
    return status;
  }
  ~OtherUser() { finish(); }
};

// Writes "job A"'s line the way DirectoryLock does (then unlocks), and makes the file read-only.
void leaveJobAsLine(const SharedDir& dir) {
  { DirectoryLock a(dir.path, "checkpoint directory", "job A (a test)"); }
  ASSERT_EQ(::chmod(dir.lockFile().c_str(), 0444), 0);
}

TEST(DirectoryLock, AUserWhoCanOnlyReadTheLockFileIsRefusedNamingTheHolder) {
  SharedDir dir;
  leaveJobAsLine(dir);
  DirectoryLock jobA(dir.path, "checkpoint directory", "job A (a test)");  // root (or this user) again
  OtherUser other([&](int toParent, int) {
    try {
      DirectoryLock jobB(dir.path, "checkpoint directory", "job B");
      writeAll(toParent, "took the lock\n");
    } catch (const InvalidArgument& e) {
      writeAll(toParent, std::string(e.what()) + "\n");
    } catch (const std::exception& e) {  // without the read-only open: "cannot open ...: Permission denied"
      writeAll(toParent, std::string("not refused by name: ") + e.what() + "\n");
    }
  });
  const std::string said = readLine(other.fromChild);
  if (said == kCannotBecomeNobody) GTEST_SKIP() << "root could not become nobody here";
  EXPECT_THAT(said, HasSubstr("checkpoint directory " + dir.path + " is in use by job A (a test), pid " +
                              std::to_string(::getpid()) + " on "));
  const int status = other.finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(DirectoryLock, AHolderThatCouldNotWriteItsLineIsNotCalledByTheEarlierOnesName) {
  SharedDir dir;
  leaveJobAsLine(dir);
  if (!procLocksListsAFlockOn(dir.lockFile())) GTEST_SKIP() << "/proc/locks does not list flocks on " << dir.path;
  OtherUser other([&](int toParent, int fromParent) {
    try {
      DirectoryLock jobB(dir.path, "checkpoint directory", "job B");  // read-only: "job A" stays in the file
      writeAll(toParent, "took the lock\n");
      readLine(fromParent);  // held until the parent has been refused
    } catch (const std::exception& e) {
      writeAll(toParent, std::string("refused: ") + e.what() + "\n");
    }
  });
  const std::string said = readLine(other.fromChild);
  if (said == kCannotBecomeNobody) GTEST_SKIP() << "root could not become nobody here";
  ASSERT_EQ(said, "took the lock");
  const std::string expected = "checkpoint directory " + dir.path + " is in use by another process, pid " +
                               std::to_string(other.pid) + " (it holds " + dir.lockFile() + ")";
  try {
    DirectoryLock jobC(dir.path, "checkpoint directory", "job C");
    ADD_FAILURE() << "job C took a lock that job B holds";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(expected));
    EXPECT_THAT(e.what(), Not(HasSubstr("job A")));
  }
  try {
    DirectoryLock::checkFree(dir.path, "checkpoint directory");
    ADD_FAILURE() << "checkFree found a held lock free";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(expected));
  }
  const int status = other.finish();  // job B's end releases the lock
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  DirectoryLock jobD(dir.path, "checkpoint directory", "job D");
}

// A lock another tool took, with a line in its own words (no "pid P on HOST since"): those words are
// the holder's, whatever /proc/locks says.
TEST(DirectoryLock, ALineInAnotherToolsWordsIsKept) {
  SharedDir dir;
  const int fd = ::open(dir.lockFile().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  writeAll(fd, std::string("job A (a test)\n"));
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  try {
    DirectoryLock jobB(dir.path, "checkpoint directory", "job B");
    ADD_FAILURE() << "job B took a lock that job A holds";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint directory " + dir.path + " is in use by job A (a test) (it holds " +
                                    dir.lockFile() + ")"));
  }
  ::close(fd);
}

}  // namespace
}  // namespace poseidon
