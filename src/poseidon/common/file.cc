#include "poseidon/common/file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

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
