#include "poseidon/common/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "poseidon/common/error.h"

namespace poseidon {
namespace fs = std::filesystem;

namespace {
uint64_t limitValue(rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(v); }
}  // namespace

uint64_t raiseDescriptorLimit(uint64_t needed) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return UINT64_MAX;  // unknown: let the open itself say
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= needed) return limitValue(lim.rlim_cur);
  rlimit want = lim;
  want.rlim_cur = lim.rlim_max == RLIM_INFINITY ? static_cast<rlim_t>(needed)
                                                : std::min(lim.rlim_max, static_cast<rlim_t>(needed));
  if (want.rlim_cur > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &want) == 0) lim = want;
  return limitValue(lim.rlim_cur);
}

uint64_t hardDescriptorLimit() {
  rlimit lim{};
  return getrlimit(RLIMIT_NOFILE, &lim) != 0 ? UINT64_MAX : limitValue(lim.rlim_max);
}

void writeFileAtomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    errno = 0;
    std::ofstream f(tmp);
    f << text;
    f.flush();
    if (!f) throw IoError(strCat("cannot write ", what, " ", path, ": ", errno ? std::strerror(errno) : "write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw IoError(strCat("cannot write ", what, " ", path, ": ", std::strerror(errno)));
}

namespace {

// Creating (and removing) a file in `dir` is the one check that sees everything: a missing
// directory, permissions (root's too: a read-only mount), a full inode table.
void probeDirectory(const std::string& flag, const std::string& path, const fs::path& dir) {
  static std::atomic<int> probes{0};  // threads of one process (in-process ranks) each get their own name
  const fs::path probe = dir / strCat(".poseidon-probe-", ::getpid(), "-", probes.fetch_add(1));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw InvalidArgument(
        strCat(flag, " ", path, ": cannot create files in ", dir.string(), ": ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

namespace {

// The lock file's holder line, for a refused job's message ("" if it says nothing: a lock taken by
// flock(1) or a holder that has not written its line yet).
std::string holderLine(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string line(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// Tries to take fd's lock; false if another open file holds it for 200 ms. The retries let a passing
// holder go by - another launcher's checkFree probe holds it for microseconds, and would otherwise get
// a job refused that shares the directory with no one. On any other error closes fd (its caller has
// no use for it) and throws.
bool tryLock(int fd, const std::string& file) {
  for (int attempt = 0;; ++attempt) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      if (attempt >= 20) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const int error = errno;
    const bool readOnly = (::fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY;
    ::close(fd);
    if (error == EBADF && readOnly)  // NFS's flock is a write lock
      throw IoError(strCat("cannot lock ", file,
                           ": it is read-only to this user, and its file system locks only files open for writing "
                           "(NFS does): ask its owner to make it writable to you, or use another directory"));
    throw IoError(strCat("cannot lock ", file, ": ", std::strerror(error)));
  }
}

// The lock file open for writing (`create`: made if missing, 0666 less the umask, as a group-writable
// directory's next job may be another user's), or read-only where it is read-only to this user: flock
// needs no write access on a local file system, the holder line then stays unwritten. -1 (errno set)
// when neither opens.
int openLockFile(const std::string& file, bool create) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
  if (fd >= 0 || errno != EACCES) return fd;
  return ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
}

std::string hostName() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  return host;
}

// The pid that holds fd's file's flock on this host, as /proc/locks lists it ("1: FLOCK  ADVISORY
// WRITE 841 fe:00:10952883 0 EOF": pid, then device major:minor in hex and inode); 0 when none is
// listed there (a holder on another host of a network file system, or no /proc).
long localFlockHolder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  std::ifstream in("/proc/locks");
  for (std::string entry; std::getline(in, entry);) {
    std::istringstream fields(entry);
    std::string id, kind, advisory, access, device;
    long pid = 0;
    // "N: -> FLOCK ..." lines are waiters, not holders.
    if (!(fields >> id >> kind >> advisory >> access >> pid >> device) || kind != "FLOCK") continue;
    unsigned devMajor = 0, devMinor = 0;
    unsigned long long inode = 0;
    if (std::sscanf(device.c_str(), "%x:%x:%llu", &devMajor, &devMinor, &inode) == 3 &&
        devMajor == major(st.st_dev) && devMinor == minor(st.st_dev) && inode == st.st_ino)
      return pid;
  }
  return 0;
}

// The pid and host a holder line of DirectoryLock's own ("<holder>, pid P on HOST since ...") names;
// false for any other line (a lock taken by another tool, or flock(1), with words of its own).
bool ownLineNames(const std::string& line, long* pid, std::string* host) {
  const size_t at = line.rfind(", pid ");
  if (at == std::string::npos) return false;
  const size_t on = line.find(" on ", at), since = line.find(" since ", at);
  if (on == std::string::npos || since == std::string::npos || since < on) return false;
  try {
    size_t used = 0;
    const std::string digits = line.substr(at + 6, on - at - 6);
    *pid = std::stol(digits, &used);
    if (used != digits.size()) return false;
  } catch (const std::exception&) {
    return false;
  }
  *host = line.substr(on + 4, since - on - 4);
  return true;
}

// Who holds the lock, for a refused job: the file's line, the holder's own words. A holder that could
// open the file only read-only (another user's lock file; flock needs no write access on a local file
// system) cannot replace the line, so it may be an earlier holder's: where it is in DirectoryLock's own
// format and names this host and a pid that /proc/locks says is not the holder, that pid is the answer.
std::string holderOf(int fd) {
  const std::string line = holderLine(fd);
  const long pid = localFlockHolder(fd);
  long named = 0;
  std::string host;
  if (pid > 0 && (line.empty() || (ownLineNames(line, &named, &host) && host == hostName() && named != pid)))
    return strCat("another process, pid ", pid);
  return line.empty() ? "another process" : line;
}

[[noreturn]] void throwTaken(int fd, const std::string& dir, const std::string& what, const std::string& file) {
  const std::string holder = holderOf(fd);
  ::close(fd);
  throw InvalidArgument(strCat(what, " ", dir, " is in use by ", holder, " (it holds ",
                               file,
                               "): two jobs writing one directory would resume from and delete each other's "
                               "files; give each job its own directory, or wait for that one to end"));
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what, const std::string& holder) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(strCat("cannot create ", what, " ", dir, ": ", ec.message()));
  const std::string file = (fs::path(dir) / kFileName).string();
  fd_ = openLockFile(file, /*create=*/true);
  if (fd_ < 0) throw IoError(strCat("cannot open ", file, ": ", std::strerror(errno)));
  if (!tryLock(fd_, file)) throwTaken(std::exchange(fd_, -1), dir, what, file);
  char since[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", &tm);
  const std::string line = strCat(holder, ", pid ", ::getpid(), " on ", hostName(), " since ", since, "\n");
  // Best effort: the line only explains a refusal, the lock itself is what excludes. A read-only
  // descriptor writes nothing and leaves an earlier holder's line, which holderOf sees through.
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, line.data(), line.size(), 0);
    (void)written;
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  ::flock(fd_, LOCK_UN);  // the open file's lock, even where a forked child still shares the descriptor
  ::close(fd_);
}

void DirectoryLock::checkFree(const std::string& dir, const std::string& what) {
  const std::string file = (fs::path(dir) / kFileName).string();
  const int fd = openLockFile(file, /*create=*/false);
  if (fd < 0) return;  // no lock file: nobody holds it (or the directory's own check reports it)
  if (!tryLock(fd, file)) throwTaken(fd, dir, what, file);
  ::close(fd);
}

std::string jsonErrorText(const std::exception& e) {
  const std::string what = e.what();
  const std::string tag = "[json.exception.";
  if (what.compare(0, tag.size(), tag) != 0) return what;
  const size_t end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

void checkOutputFile(const std::string& flag, const std::string& path) {
  if (path.empty()) throw InvalidArgument(strCat(flag, " needs a file name, got an empty one"));
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InvalidArgument(strCat(flag, " ", path, ": is a directory, expected a file name"));
  const fs::path dir = fs::path(path).parent_path();
  probeDirectory(flag, path, dir.empty() ? fs::path(".") : dir);
}

void checkOutputDirectory(const std::string& flag, const std::string& dir) {
  if (dir.empty()) throw InvalidArgument(strCat(flag, " needs a directory, got an empty name"));
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InvalidArgument(strCat(flag, " ", dir, ": is a file, expected a directory"));
  fs::create_directories(dir, ec);  // the run would create it anyway
  if (ec) throw InvalidArgument(strCat(flag, " ", dir, ": cannot create it: ", ec.message()));
  probeDirectory(flag, dir, dir);
}

}  // namespace poseidon
