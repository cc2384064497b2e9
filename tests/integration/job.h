// A job of real poseidon_test_node processes over real ZeroMQ on localhost, for the multi-process
// tests (multiprocess_test.cc, fault_injection_test.cc): start one, wait for its events, read and
// check what each rank reports.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "poseidon/launch/env.h"
#include "poseidon/transport/security.h"
#include "process.h"
#include "scenario.h"

namespace poseidon::testing {


struct Job {
  std::string dir;
  std::string secret;
  int port = 0;
  int timeoutMs = 0;  // every rank's --timeout: the deadline of every wait for the job's events
  std::vector<Proc> procs;
  Job() = default;
  Job(Job&&) = default;
  ~Job() {
    if (!dir.empty() && dir.rfind("/tmp/poseidon-", 0) == 0) std::filesystem::remove_all(dir);
  }
};

inline Job startJob(int ranks, int worldSize, const std::string& scenario, const std::string& policy, int iterations,
             int timeoutMs = 20000, std::map<int, std::map<std::string, std::string>> extra = {}) {
  Job job;
  job.dir = testing::makeTempDir(scenario);
  job.port = freePort("127.0.0.1");
  job.timeoutMs = timeoutMs;
  job.secret = randomSecret();
  for (int r = 0; r < ranks; ++r) {
    std::map<std::string, std::string> env{{"RANK", std::to_string(r)},
                                           {"WORLD_SIZE", std::to_string(worldSize)},
                                           {"MASTER_ADDR", "127.0.0.1"},
                                           {"MASTER_PORT", std::to_string(job.port)},
                                           {"POSEIDON_SECRET", job.secret}};
    for (const auto& [k, v] : extra[r]) env[k] = v;
    job.procs.push_back(testing::spawn({POSEIDON_TEST_NODE, scenario, policy, std::to_string(iterations), job.dir,
                                        std::to_string(timeoutMs)},
                                       env, job.dir + "/log" + std::to_string(r)));
  }
  return job;
}

inline nlohmann::json report(const Job& job, int rank) {
  std::ifstream f(job.dir + "/rank" + std::to_string(rank) + ".json");
  return nlohmann::json::parse(f);
}

inline void expectAllSucceeded(const Job& job) {
  for (size_t r = 0; r < job.procs.size(); ++r) {
    ASSERT_FALSE(job.procs[r].killed) << "rank " << r << " hung:\n" << job.procs[r].stderrText();
    ASSERT_EQ(job.procs[r].exitCode(), 0) << "rank " << r << ":\n" << job.procs[r].stderrText();
  }
}

// psTolerance: a 16-bit wire rounds each PS sum once for the way back (bf16: 2^-8 relative).
inline void expectCorrect(const Job& job, const std::map<std::string, std::string>& schemes, double psTolerance = 1e-6) {
  ModelDesc model = testing::scenarioModel();
  for (size_t r = 0; r < job.procs.size(); ++r) {
    auto rep = report(job, static_cast<int>(r));
    ASSERT_EQ(rep["layers"].size(), model.layers.size());
    for (size_t l = 0; l < model.layers.size(); ++l) {
      const auto& L = rep["layers"][l];
      const std::string& name = model.layers[l].name;
      if (schemes.count(name)) {
        EXPECT_EQ(L["scheme"], schemes.at(name)) << name;
      }
      if (L["scheme"] == "ps") {
        // PS sums in a fixed worker order: bit-exact against the same float sum.
        EXPECT_TRUE(L["bit_exact"].get<bool>()) << "rank " << r << " layer " << name;
        EXPECT_LT(L["max_rel_error"].get<double>(), psTolerance) << "rank " << r << " layer " << name;
      } else {
        EXPECT_LT(L["max_rel_error"].get<double>(), 1e-5) << "rank " << r << " layer " << name;
      }
    }
  }
}

inline std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A rank's data endpoint and the job id, once it has joined (it writes them to a file).
inline std::pair<std::string, uint64_t> waitForEndpoint(const Job& job, int rank) {
  std::string path = job.dir + "/endpoint" + std::to_string(rank);
  // A rank that has not joined within twice the job's timeout (its start, then the rendezvous, which
  // rank 0 gives up after one timeout) never will.
  testing::waitFor([&] { return !readFile(path).empty(); }, std::chrono::milliseconds(2 * job.timeoutMs), {job.dir});
  std::istringstream in(readFile(path));
  std::string endpoint;
  uint64_t jobId = 0;
  in >> endpoint >> jobId;
  return {endpoint, jobId};
}

// Every rank waits for the gate file before it trains (test_node's POSEIDON_TEST_TRAIN_AFTER).
inline std::map<int, std::map<std::string, std::string>> trainAfter(const std::string& gate, int ranks) {
  std::map<int, std::map<std::string, std::string>> env;
  for (int r = 0; r < ranks; ++r) env[r] = {{"POSEIDON_TEST_TRAIN_AFTER", gate}};
  return env;
}

}  // namespace poseidon::testing
