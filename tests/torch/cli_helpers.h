// Running the real poseidon CLI from the torch tests.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../integration/process.h"

namespace poseidon::testing {

struct TempDir {
  std::string path = makeTempDir("cli");
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Runs `poseidon ARGS...` to completion (killed after the timeout), with its
// output in LOG.out / LOG.err.
inline Proc runCli(const std::vector<std::string>& args, const std::string& log,
                   const std::map<std::string, std::string>& env = {}, int timeoutSeconds = 300) {
  std::vector<std::string> argv{POSEIDON_CLI};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<Proc> procs{spawn(argv, env, log)};
  waitAll(procs, std::chrono::seconds(timeoutSeconds));
  return procs[0];
}

inline std::string readBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A JSON file the CLI wrote (--json, --summary).
inline nlohmann::json readJson(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

inline std::vector<float> readFloats(const std::string& path) {
  std::string bytes = readBytes(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// How many of two equally long parameter dumps' floats differ (0: bit for bit the same model).
inline size_t countDiffering(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) differ += a[i] != b[i];
  return differ;
}

}  // namespace poseidon::testing
