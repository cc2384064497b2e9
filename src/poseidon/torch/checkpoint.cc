#include "poseidon/torch/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon::pt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step-";

void fsyncPath(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw IoError("cannot open " + p.string() + " to sync it");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw IoError("fsync failed on " + p.string());
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
  try {
    fs::create_directories(dir);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    torch::serialize::OutputArchive ma, oa;
    module.save(ma);
    ma.save_to((tmp / "model.pt").string());
    optimizer.save(oa);
    oa.save_to((tmp / "optimizer.pt").string());
    {
      std::ofstream f(tmp / "meta.json");
      f << meta.toJson().dump(2) << "\n";
      if (!f) throw IoError("cannot write " + (tmp / "meta.json").string());
    }
    for (const char* file : {"model.pt", "optimizer.pt", "meta.json"}) fsyncPath(tmp / file);
    fsyncPath(tmp);
    fs::remove_all(final);
    fs::rename(tmp, final);
    fsyncPath(dir);
  } catch (const fs::filesystem_error& e) {
    throw IoError(std::string("cannot write checkpoint in ") + dir + ": " + e.what());
  } catch (const c10::Error& e) {
    throw IoError(std::string("cannot write checkpoint in ") + dir + ": " + e.what_without_backtrace());
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
