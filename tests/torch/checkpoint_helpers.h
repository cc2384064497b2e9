// Checkpoint tests' tools: a training state to save, a small disk, and ways
// to damage a file in place.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "poseidon/torch/checkpoint.h"
#include "poseidon/torch/models.h"

namespace poseidon::testing {

// A model and its SGD-with-momentum optimizer, as the trainer builds them.
struct TrainState {
  pt::AnyNet net;
  torch::optim::SGD optimizer;
  pt::CheckpointMeta meta;

  explicit TrainState(const std::string& model = "lenet")
      : net(pt::makeModel(model)),
        optimizer(net.module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)) {
    meta.model = model;
    meta.workers = 1;
    meta.batch = 4;
    meta.seed = 1;
    step();
  }
  // One SGD step on random data: moves the parameters and fills the momentum
  // buffers, so consecutive checkpoints differ.
  void step() {
    optimizer.zero_grad();
    torch::Tensor x = torch::randn({4, 1, 28, 28}), y = torch::randint(0, 10, {4}, torch::kLong);
    torch::nll_loss(torch::log_softmax(net.forward(x), 1), y).backward();
    optimizer.step();
  }
  std::string save(const std::string& dir, int64_t iteration) {
    meta.iteration = iteration;
    return pt::saveCheckpoint(dir, meta, *net.module, optimizer);
  }
  std::vector<torch::Tensor> params() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : net.module->parameters()) out.push_back(p.detach().clone());
    return out;
  }
};

inline bool sameTensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// A tmpfs of a given size on a fresh directory, unmounted at the end. Mounting
// needs root (CI runs the tests as root); skipReason() says why it is not mounted.
class SmallDisk {
 public:
  SmallDisk(const std::string& path, uint64_t bytes) : path_(path) {
    std::filesystem::create_directories(path);
    if (::geteuid() != 0) {
      why_ = "needs root to mount a tmpfs (a small disk to fill)";
      return;
    }
    if (::mount("tmpfs", path.c_str(), "tmpfs", 0, sizeOption(bytes).c_str()) != 0) {
      why_ = std::string("cannot mount a tmpfs on ") + path + ": " + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& skipReason() const { return why_; }
  const std::string& path() const { return path_; }
  // Grows (or shrinks) the disk in place; its files stay.
  bool resize(uint64_t bytes) {
    return ::mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT, sizeOption(bytes).c_str()) == 0;
  }

 private:
  static std::string sizeOption(uint64_t bytes) { return "size=" + std::to_string(bytes); }
  std::string path_, why_;
  bool mounted_ = false;
};

// tmpfs charges whole pages per file.
inline uint64_t pagesFor(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

inline uint64_t fileBytes(const std::string& path) { return std::filesystem::file_size(path); }

// Overwrites n bytes at offset with zeros, in place.
inline void zeroBytes(const std::string& path, uint64_t offset, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  std::string zeros(n, '\0');
  f.write(zeros.data(), static_cast<std::streamsize>(n));
}

// Flips the low bit of the byte at offset, in place.
inline void flipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 1));
}

// In meta.json, turns "iteration": 10 into "iteration": 30: still valid JSON,
// now telling a lie that only its own checksum can catch.
inline void alterIteration(const std::string& metaPath) {
  std::ifstream in(metaPath);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  auto at = text.find("\"iteration\": 1");
  if (at == std::string::npos) throw std::runtime_error("no \"iteration\": 1... in " + metaPath);
  text[at + std::strlen("\"iteration\": ")] = '3';
  std::ofstream(metaPath) << text;
}

}  // namespace poseidon::testing
