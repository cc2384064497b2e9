// Small files written whole: summaries, traces, progress reports; and the check, before a long run,
// that its outputs can be written at all.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace poseidon {

// Writes `text` to path.tmp and renames it over `path`, so a reader never sees a half-written
// file. Throws IoError("cannot write <what> <path>"). (Checkpoints, which must also survive a
// crash, add fsync: torch/checkpoint.cc.)
void writeFileAtomically(const std::string& path, const std::string& text, const std::string& what);

// Before a run that writes `path` at its end: throws InvalidArgument("<flag> <path>: ...") unless a
// file can be made there - not a directory, and a file can be created (and is removed) beside it,
// the one check that sees a missing directory, permissions and a read-only file system alike. An
// hour's results are not lost to a typo found at the end.
void checkOutputFile(const std::string& flag, const std::string& path);
// The same for a directory a run writes files into, created (with its parents) if missing.
void checkOutputDirectory(const std::string& flag, const std::string& dir);

// An exclusive lock on a directory for one job: DIR/.poseidon.lock held with flock(2) for this object's
// life. A second holder - another job, or the same process again - is refused with the holder's line
// (pid, host, what it is) from the file. The kernel drops the lock when its holder exits, however it
// exits (killed, crashed), so a stale lock never outlives its job; a restarted job takes it again.
// Creates DIR (with its parents). Throws InvalidArgument("<what> <dir> is in use by <holder>; ...")
// when taken, IoError when the lock file cannot be opened at all.
class DirectoryLock {
 public:
  // `what` names the directory in messages ("checkpoint directory"); `holder` is written into the
  // lock file for a refused job to read ("poseidon train rank 0").
  DirectoryLock(const std::string& dir, const std::string& what, const std::string& holder);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // Throws as the constructor does if dir's lock is held now, else returns having taken nothing (a
  // launcher's check before its ranks start; a missing dir or lock file is free).
  static void checkFree(const std::string& dir, const std::string& what);

  static constexpr const char* kFileName = ".poseidon.lock";

 private:
  int fd_ = -1;
};

// Raises this process's soft limit on open file descriptors toward `needed` (up to the hard limit),
// as Go's runtime does at start-up: many systems start processes at 1,024, and what runs out meets
// EMFILE far from this cause. Returns the soft limit now (UINT64_MAX: unlimited); children inherit it.
uint64_t raiseDescriptorLimit(uint64_t needed);
// The hard limit (UINT64_MAX: unlimited), for messages.
uint64_t hardDescriptorLimit();

// A JSON library error as a user reads it: "parse error at line 1, column 1: syntax error while
// parsing value - invalid literal; last read: 'x'", without nlohmann's "[json.exception.parse_error.101] "
// in front (any other exception's text as it is).
std::string jsonErrorText(const std::exception& e);

}  // namespace poseidon
