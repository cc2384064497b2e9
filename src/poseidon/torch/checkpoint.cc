#include "poseidon/torch/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

namespace poseidon::pt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step-";
// The files meta.json's checksums cover (meta.json covers itself with meta_crc32).
constexpr const char* kDataFiles[] = {"model.pt", "optimizer.pt"};

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

uint32_t crcOf(const void* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, Z_NULL, 0), static_cast<const Bytef*>(data), n));
}

uint32_t crcOf(const std::string& s) { return crcOf(s.data(), s.size()); }

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
// writer is gone. The CRC-32 is taken of exactly the bytes handed to write().
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
    crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), n);
    bytes_ += n;
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

  nlohmann::json entry() const { return {{"bytes", bytes_}, {"crc32", hex32(static_cast<uint32_t>(crc_))}}; }

 private:
  fs::path path_;
  int fd_ = -1;
  int error_ = 0;
  uLong crc_ = crc32_z(0, Z_NULL, 0);
  uint64_t bytes_ = 0;
};

nlohmann::json writeArchive(torch::serialize::OutputArchive& archive, const fs::path& path) {
  FileSink sink(path);
  archive.save_to([&sink](const void* data, size_t n) { return sink.write(data, n); });
  sink.commit();
  return sink.entry();
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

// meta.json: the job layout, each data file's size and CRC-32, and a CRC-32
// of the rest of meta.json itself (over its compact dump, keys sorted), so a
// changed digit in the iteration or a checksum is caught too.
std::string metaText(const CheckpointMeta& meta, const nlohmann::json& files) {
  nlohmann::json j = meta.toJson();
  j["files"] = files;
  j["meta_crc32"] = hex32(crcOf(j.dump()));
  return j.dump(2) + "\n";
}

// Reads a whole file; returns 0 or the errno.
int readWholeFile(const fs::path& p, std::string* out) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return e;
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    ssize_t r = ::read(fd, out->data() + got, out->size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ::close(fd);
      return e;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  out->resize(got);
  ::close(fd);
  return 0;
}

[[noreturn]] void damaged(const std::string& path, const std::string& what) {
  throw CheckpointDamaged("checkpoint " + path + " is damaged: " + what);
}

nlohmann::json readMeta(const std::string& path) {
  std::string text;
  if (int e = readWholeFile(fs::path(path) / "meta.json", &text); e != 0) {
    throw CheckpointDamaged("checkpoint " + path + " is unreadable: meta.json: " + std::strerror(e));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw CheckpointDamaged("checkpoint " + path + " is unreadable: meta.json is not valid JSON");
  }
  return j;
}

// Checkpoints written before checksums have neither key; ours always both.
bool hasChecksums(const nlohmann::json& j) { return j.contains("files") || j.contains("meta_crc32"); }

// What a refused checkpoint's owner can do instead, in the words of who asked: the CLI's flag, or the API.
std::string anotherDirectory(const CheckpointMeta& expect) {
  return expect.namedAsFlags ? "use another --checkpoint DIR" : "use another checkpoint directory";
}

void verifyMeta(const std::string& path, const nlohmann::json& j, const CheckpointMeta& expect) {
  // The Python API's checkpoints (poseidon.save_checkpoint) check their files but not their meta, and
  // hold a Python module's state: another format, not damage (which would advise removing them).
  if (j.contains("files") && !j.contains("meta_crc32") && j.contains("world_size")) {
    throw InvalidArgument("checkpoint " + path + " was written by poseidon's Python API (poseidon.save_checkpoint); " +
                          (expect.namedAsFlags ? "poseidon train" : "the C++ API (checkpoint.h)") +
                          " resumes only its own: " + anotherDirectory(expect));
  }
  if (!j.contains("meta_crc32") || !j["meta_crc32"].is_string() || !j.contains("files") || !j["files"].is_object()) {
    damaged(path, "meta.json lacks its checksums");
  }
  nlohmann::json rest = j;
  rest.erase("meta_crc32");
  if (hex32(crcOf(rest.dump())) != j["meta_crc32"].get<std::string>()) {
    damaged(path, "meta.json does not match its own checksum");
  }
}

CheckpointMeta parseMeta(const std::string& path, const nlohmann::json& j) {
  CheckpointMeta m;
  try {
    m.model = j.at("model").get<std::string>();
    m.iteration = j.at("iteration").get<int64_t>();
    m.workers = j.at("workers").get<int>();
    m.batch = j.at("batch").get<int64_t>();
    m.seed = j.at("seed").get<uint64_t>();
    m.trainLimit = j.value("train_limit", int64_t{-1});
    m.groups = j.value("groups", 0);
    m.groupVersion = j.value("group_version", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointDamaged("checkpoint " + path + " is unreadable (meta.json: " + e.what() + ")");
  }
  return m;
}

void checkLayout(const std::string& path, const CheckpointMeta& m, const CheckpointMeta& expect) {
  // The CLI's user changes a flag; an API user, the CheckpointMeta field the name stands for.
  const bool flags = expect.namedAsFlags;
  auto mismatch = [&](const char* flag, const char* field, const std::string& theirs, const std::string& ours) {
    throw InvalidArgument("checkpoint " + path + " was written with " + (flags ? flag : field) + " " + theirs +
                          ", this run has " + ours + "; resume with the same settings or " + anotherDirectory(expect));
  };
  if (m.model != expect.model) mismatch("--model", "model", m.model, expect.model);
  if (m.workers != expect.workers) {
    mismatch("--workers", "workers", std::to_string(m.workers), std::to_string(expect.workers));
  }
  if (m.batch != expect.batch) mismatch("--batch", "batch", std::to_string(m.batch), std::to_string(expect.batch));
  if (m.seed != expect.seed) mismatch("--seed", "seed", std::to_string(m.seed), std::to_string(expect.seed));
  if (m.trainLimit != expect.trainLimit) {
    mismatch("--train-limit", "trainLimit", std::to_string(m.trainLimit), std::to_string(expect.trainLimit));
  }
  // Every group's clock restarts at the checkpoint's iteration, so a group-mode checkpoint is valid for
  // any number of groups; changing it is asked for explicitly (a typo should not regroup a job).
  const bool regrouped = expect.regroup && m.groups > 0 && expect.groups > 0;
  if (m.groups != expect.groups && !regrouped) {
    const std::string allowed = flags ? " (--regroup allows it)" : " (regroup allows it)";
    mismatch("--groups", "groups", std::to_string(m.groups),
             std::to_string(expect.groups) + (m.groups > 0 && expect.groups > 0 ? allowed : ""));
  }
}

// The bytes of one data file, checked against its entry in meta.json.
std::string readVerified(const std::string& path, const std::string& file, const nlohmann::json& files) {
  if (!files.contains(file) || !files[file].is_object()) damaged(path, "meta.json has no checksum for " + file);
  const nlohmann::json& entry = files[file];
  std::string bytes;
  if (int e = readWholeFile(fs::path(path) / file, &bytes); e != 0) damaged(path, file + ": " + std::strerror(e));
  const uint64_t expectBytes = entry.value("bytes", uint64_t{0});
  if (bytes.size() != expectBytes) {
    damaged(path, strCat(file, " has ", bytes.size(), " bytes, meta.json says ", expectBytes));
  }
  const std::string crc = hex32(crcOf(bytes)), expectCrc = entry.value("crc32", std::string());
  if (crc != expectCrc) {
    damaged(path, file + " does not match its checksum in meta.json (CRC-32 " + crc + ", expected " + expectCrc + ")");
  }
  return bytes;
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

// The module's tensors from an archive Module::save wrote (its parameters and buffers under their
// own names, each child in an archive of its own), every one checked against the module's before
// any is copied: a checkpoint of a changed architecture is refused naming the tensor (LibTorch's
// Module::load resized the parameters to the old shapes and trained the old model). Copied in place
// (copy_, not Module::load's set_), so the parameters keep their storage: a DistributedModel built
// before the resume keeps seeing them and their gradients.
struct Loaded {
  torch::Tensor into, from;
};

void collect(torch::serialize::InputArchive& archive, torch::nn::Module& module, const std::string& prefix,
             const std::string& path, std::vector<Loaded>* out) {
  auto one = [&](const std::string& name, const torch::Tensor& into, bool buffer) {
    const std::string full = prefix + name;
    torch::Tensor from;
    if (!archive.try_read(name, from, buffer)) {
      throw InvalidArgument(strCat("checkpoint ", path, " has no ", buffer ? "buffer " : "parameter ", full,
                                   ": it was written from another model"));
    }
    if (from.sizes() != into.sizes() || from.scalar_type() != into.scalar_type()) {
      throw InvalidArgument(strCat("checkpoint ", path, " holds ", full, " as ", c10::toString(from.scalar_type()), " ",
                                   from.sizes(), ", this model's is ", c10::toString(into.scalar_type()), " ", into.sizes(),
                                   ": it was written from another architecture"));
    }
    out->push_back({into, from});
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) one(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    if (b.value().defined()) one(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;  // Module::save skips them (torch::nn::Functional)
    torch::serialize::InputArchive sub;
    if (!archive.try_read(child.key(), sub)) {
      throw InvalidArgument(strCat("checkpoint ", path, " has no module ", prefix + child.key(),
                                   ": it was written from another model"));
    }
    collect(sub, *child.value(), prefix + child.key() + ".", path, out);
  }
}

void loadModule(torch::serialize::InputArchive& archive, torch::nn::Module& module, const std::string& path) {
  std::vector<Loaded> all;
  collect(archive, module, "", path, &all);
  torch::NoGradGuard noGrad;
  for (auto& t : all) t.into.copy_(t.from);
}

}  // namespace

nlohmann::json CheckpointMeta::toJson() const {
  nlohmann::json j{{"model", model}, {"iteration", iteration}, {"workers", workers},
                   {"batch", batch}, {"seed", seed},           {"train_limit", trainLimit}};
  if (groups > 0) {
    j["groups"] = groups;
    j["group_version"] = groupVersion;
  }
  return j;
}

void checkCheckpointLayout(const std::string& dir, const CheckpointMeta& expect) {
  const auto all = listComplete(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string path = it->second.string();
    try {
      const nlohmann::json j = readMeta(path);
      if (hasChecksums(j)) verifyMeta(path, j, expect);
      checkLayout(path, parseMeta(path, j), expect);
      return;
    } catch (const CheckpointDamaged&) {
      // Skipped for an older one, as resumeFromNewest skips it (and says so).
    }
  }
}

std::string newestCheckpoint(const std::string& dir) {
  auto all = listComplete(dir);
  return all.empty() ? std::string() : all.back().second.string();
}

std::string saveCheckpoint(const std::string& dir, const CheckpointMeta& meta, torch::nn::Module& module,
                           torch::optim::Optimizer& optimizer, int keep) {
  if (keep < 1) throw InvalidArgument(strCat("saveCheckpoint: keep must be at least 1 (the newest), got ", keep));
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
    nlohmann::json files;
    files["model.pt"] = writeArchive(modelArchive, tmp / "model.pt");
    files["optimizer.pt"] = writeArchive(optimizerArchive, tmp / "optimizer.pt");
    writeText(metaText(meta, files), tmp / "meta.json");  // last: a directory with meta.json is complete
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
                              torch::optim::Optimizer& optimizer, std::vector<std::string>* warnings) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InvalidArgument("checkpoint " + path + " does not exist");
  nlohmann::json j = readMeta(path);
  const bool verified = hasChecksums(j);
  if (verified) verifyMeta(path, j, expect);
  CheckpointMeta m = parseMeta(path, j);
  checkLayout(path, m, expect);
  // Both files are checked before either is loaded, so a damaged checkpoint
  // leaves the module and optimizer as they were.
  std::string modelBytes, optimizerBytes;
  if (verified) {
    modelBytes = readVerified(path, kDataFiles[0], j["files"]);
    optimizerBytes = readVerified(path, kDataFiles[1], j["files"]);
  } else if (warnings) {
    warnings->push_back("checkpoint " + path +
                        " has no checksums (written by an older poseidon); resuming from it unverified");
  }
  // Whatever device the tensors were saved from, they load onto the model's (a checkpoint written on a
  // GPU resumes on the CPU and the other way round).
  c10::optional<c10::Device> device;  // c10's: std::optional only from torch 2.x on
  for (const auto& p : module.parameters()) {
    device = p.device();
    break;
  }
  try {
    torch::serialize::InputArchive modelArchive, optimizerArchive;
    if (verified) {
      modelArchive.load_from(modelBytes.data(), modelBytes.size(), device);
      optimizerArchive.load_from(optimizerBytes.data(), optimizerBytes.size(), device);
    } else {
      modelArchive.load_from((fs::path(path) / kDataFiles[0]).string(), device);
      optimizerArchive.load_from((fs::path(path) / kDataFiles[1]).string(), device);
    }
    loadModule(modelArchive, module, path);
    optimizer.load(optimizerArchive);
  } catch (const c10::Error& e) {
    // Unverified (no checksums): a file LibTorch cannot read is damage, and resume falls back to an
    // older checkpoint. Verified files are intact, so the format is what it cannot read.
    if (!verified) damaged(path, e.what_without_backtrace());
    throw InvalidArgument("cannot load checkpoint " + path + ": " + e.what_without_backtrace());
  }
  return m;
}

Resumed resumeFromNewest(const std::string& dir, const CheckpointMeta& expect, torch::nn::Module& module,
                         torch::optim::Optimizer& optimizer) {
  // A missing directory is a first run; one checkpoint given for the directory of them would be one too,
  // silently: refused, as a file is.
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InvalidArgument("checkpoint directory " + dir + " is a file");
  if (fs::exists(fs::path(dir) / "meta.json", ec)) {
    throw InvalidArgument("checkpoint directory " + dir + " is one checkpoint (it holds meta.json): give the "
                          "directory that holds the step-N checkpoints, its parent, or load this one with loadCheckpoint");
  }
  auto all = listComplete(dir);
  std::vector<std::string> refused;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Resumed r;
    std::vector<std::string> notes;
    try {
      r.meta = loadCheckpoint(it->second.string(), expect, module, optimizer, &notes);
    } catch (const CheckpointDamaged& e) {
      refused.push_back(e.what());
      continue;
    }
    r.path = it->second.string();
    for (const auto& why : refused) r.warnings.push_back(why + "; refused it, resuming from the older " + r.path);
    r.warnings.insert(r.warnings.end(), notes.begin(), notes.end());
    return r;
  }
  if (!refused.empty()) {
    std::string all = refused[0];
    for (size_t i = 1; i < refused.size(); ++i) all += "; " + refused[i];
    throw InvalidArgument("no intact checkpoint in " + dir + ": " + all +
                          "; remove the damaged checkpoints or " + anotherDirectory(expect));
  }
  return {};
}

}  // namespace poseidon::pt
