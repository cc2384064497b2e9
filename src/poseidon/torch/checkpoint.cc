#include "poseidon/torch/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon::pt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step-";

// A failed write, by file and errno; saveCheckpoint turns it into one message.
struct WriteFailure {
  std::string file;
  int error;
};

// One checkpoint file written with plain POSIX calls. write() never throws
// and always reports success to its caller: torch's stream writer throws on a
// short write and then throws again from its destructor during the unwinding,
// which terminates the process (a full disk used to end in SIGABRT and a stack
// dump). The first errno is kept instead, and commit() throws it once torch's
// writer is gone.
class FileSink {
 public:
  explicit FileSink(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) error_ = errno;
  }
  ~FileSink() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  size_t write(const void* data, size_t n) {
    if (error_ != 0 || n == 0) return n;
    if (data == nullptr) {
      error_ = EINVAL;
      return n;
    }
    const char* p = static_cast<const char*>(data);
    for (size_t left = n; left > 0;) {
      ssize_t w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        error_ = errno;
        break;
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
    return n;
  }

  // fsync, then close, each checked: on filesystems that allocate late
  // (delayed allocation, NFS) a full disk shows only there.
  void commit() {
    if (error_ == 0 && ::fsync(fd_) != 0) error_ = errno;
    if (fd_ >= 0) {
      int fd = fd_;
      fd_ = -1;
      if (::close(fd) != 0 && error_ == 0) error_ = errno;
    }
    if (error_ != 0) throw WriteFailure{path_.filename().string(), error_};
  }

 private:
  fs::path path_;
  int fd_ = -1;
  int error_ = 0;
};

void writeArchive(torch::serialize::OutputArchive& archive, const fs::path& path) {
  FileSink sink(path);
  archive.save_to([&sink](const void* data, size_t n) { return sink.write(data, n); });
  sink.commit();
}

void writeText(const std::string& text, const fs::path& path) {
  FileSink sink(path);
  sink.write(text.data(), text.size());
  sink.commit();
}

void syncDirectory(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw WriteFailure{p.string() + " (directory)", errno};
  int rc = ::fsync(fd), error = errno;
  ::close(fd);
  if (rc != 0) throw WriteFailure{p.string() + " (directory)", error};
}

std::vector<std::pair<int64_t, fs::path>> listComplete(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(kPrefix, 0) != 0 || n.find(".tmp") != std::string::npos) continue;
    if (!fs::exists(e.path() / "meta.json")) continue;  // meta.json is written last
    char* end = nullptr;
    long long it = std::strtoll(n.c_str() + 5, &end, 10);
    if (*end != '\0') continue;
    out.push_back({it, e.path()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

nlohmann::json CheckpointMeta::toJson() const {
  return {{"model", model}, {"iteration", iteration}, {"workers", workers},
          {"batch", batch}, {"seed", seed},           {"train_limit", trainLimit}};
}

std::string newestCheckpoint(const std::string& dir) {
  auto all = listComplete(dir);
  return all.empty() ? std::string() : all.back().second.string();
}

std::string saveCheckpoint(const std::string& dir, const CheckpointMeta& meta, torch::nn::Module& module,
                           torch::optim::Optimizer& optimizer, int keep) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%09lld", kPrefix, static_cast<long long>(meta.iteration));
  fs::path final = fs::path(dir) / name, tmp = fs::path(dir) / (std::string(name) + ".tmp");
  // A failed checkpoint leaves nothing behind: its space goes back (on a full
  // disk that is what the next try needs) and the older checkpoints stay the
  // resume point.
  auto fail = [&](const std::string& why) -> IoError {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return IoError("cannot write checkpoint " + final.string() + ": " + why + " (the checkpoints already in " + dir +
                   " are untouched)");
  };
  try {
    fs::create_directories(dir);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    torch::serialize::OutputArchive modelArchive, optimizerArchive;
    module.save(modelArchive);
    optimizer.save(optimizerArchive);
    writeArchive(modelArchive, tmp / "model.pt");
    writeArchive(optimizerArchive, tmp / "optimizer.pt");
    writeText(meta.toJson().dump(2) + "\n", tmp / "meta.json");  // last: a directory with meta.json is complete
    syncDirectory(tmp);
    fs::remove_all(final);
    fs::rename(tmp, final);
    syncDirectory(dir);
  } catch (const WriteFailure& f) {
    throw fail(f.file + ": " + std::strerror(f.error));
  } catch (const fs::filesystem_error& e) {
    throw fail(e.what());
  } catch (const c10::Error& e) {
    throw fail(e.what_without_backtrace());
  }
  auto all = listComplete(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i].second, ec);
  }
  return final.string();
}

CheckpointMeta loadCheckpoint(const std::string& path, const CheckpointMeta& expect, torch::nn::Module& module,
                              torch::optim::Optimizer& optimizer) {
  std::ifstream mf(fs::path(path) / "meta.json");
  nlohmann::json j = nlohmann::json::parse(mf, nullptr, false);
  if (!mf || j.is_discarded() || !j.is_object()) {
    throw InvalidArgument("checkpoint " + path + " is unreadable (bad meta.json); remove it or use another --checkpoint DIR");
  }
  CheckpointMeta m;
  try {
    m.model = j.at("model").get<std::string>();
    m.iteration = j.at("iteration").get<int64_t>();
    m.workers = j.at("workers").get<int>();
    m.batch = j.at("batch").get<int64_t>();
    m.seed = j.at("seed").get<uint64_t>();
    m.trainLimit = j.value("train_limit", int64_t{-1});
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("checkpoint " + path + " is unreadable (meta.json: " + e.what() + ")");
  }
  auto mismatch = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    throw InvalidArgument("checkpoint " + path + " was written with " + what + " " + theirs + ", this run has " + ours +
                          "; resume with the same settings or use another --checkpoint DIR");
  };
  if (m.model != expect.model) mismatch("--model", m.model, expect.model);
  if (m.workers != expect.workers) mismatch("--workers", std::to_string(m.workers), std::to_string(expect.workers));
  if (m.batch != expect.batch) mismatch("--batch", std::to_string(m.batch), std::to_string(expect.batch));
  if (m.seed != expect.seed) mismatch("--seed", std::to_string(m.seed), std::to_string(expect.seed));
  if (m.trainLimit != expect.trainLimit) {
    mismatch("--train-limit", std::to_string(m.trainLimit), std::to_string(expect.trainLimit));
  }
  try {
    torch::serialize::InputArchive ma, oa;
    ma.load_from((fs::path(path) / "model.pt").string());
    module.load(ma);
    oa.load_from((fs::path(path) / "optimizer.pt").string());
    optimizer.load(oa);
  } catch (const c10::Error& e) {
    throw InvalidArgument("cannot load checkpoint " + path + ": " + e.what_without_backtrace());
  }
  return m;
}

}  // namespace poseidon::pt
