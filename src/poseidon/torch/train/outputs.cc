#include "poseidon/torch/train/outputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"

namespace poseidon::pt {

namespace {

// Creating (and removing) a file where the output goes is the one check that sees everything: a
// missing directory, permissions, a read-only or full file system.
void probeDirectory(const std::string& flag, const std::string& path, const std::filesystem::path& dir, int rank) {
  std::filesystem::path probe = dir / strCat(".poseidon-probe-", rank, "-", ::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw InvalidArgument(
        strCat(flag, " ", path, ": cannot create files in ", dir.string(), ": ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void checkOutputFile(const std::string& flag, const std::string& path, int rank) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InvalidArgument(strCat(flag, " ", path, ": is a directory, expected a file name"));
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  probeDirectory(flag, path, dir.empty() ? std::filesystem::path(".") : dir, rank);
}

}  // namespace

void checkOutputPaths(const TrainOptions& o, int rank) {
  if (rank == 0 && !o.checkpointDir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpointDir, ec);  // saveCheckpoint would create it anyway
    if (ec) throw InvalidArgument(strCat("--checkpoint ", o.checkpointDir, ": cannot create it: ", ec.message()));
    probeDirectory("--checkpoint", o.checkpointDir, o.checkpointDir, rank);
  }
  if (rank == 0 && !o.summaryPath.empty()) checkOutputFile("--summary", o.summaryPath, rank);
  if (rank == 0 && !o.saveParamsPath.empty()) checkOutputFile("--save-params", o.saveParamsPath, rank);
  // Every rank writes <trace>.rank<R> next to --trace (merged into it at the end).
  if (!o.tracePath.empty()) checkOutputFile("--trace", o.tracePath, rank);
}

void writeProgress(const std::string& path, int64_t iteration, int64_t checkpointIteration) {
  if (path.empty()) return;
  try {
    writeFileAtomically(
        path, nlohmann::json{{"iteration", iteration}, {"checkpoint_iteration", checkpointIteration}}.dump() + "\n",
        "progress file");
  } catch (const IoError&) {
    // Best effort: without it a restart only says less about what was lost.
  }
}

}  // namespace poseidon::pt
