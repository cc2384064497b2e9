// Multi-process tests: real poseidon_test_node processes over real ZeroMQ
// on localhost (the in-process tests in tests/core cover the same paths
// with threads).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <thread>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <zmq.hpp>

#include "poseidon/core/best_scheme.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/launch/env.h"
#include "poseidon/transport/security.h"
#include "poseidon/wire/frame.h"
#include "process.h"
#include "scenario.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using testing::Proc;

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

Job startJob(int ranks, int worldSize, const std::string& scenario, const std::string& policy, int iterations,
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

nlohmann::json report(const Job& job, int rank) {
  std::ifstream f(job.dir + "/rank" + std::to_string(rank) + ".json");
  return nlohmann::json::parse(f);
}

void expectAllSucceeded(const Job& job) {
  for (size_t r = 0; r < job.procs.size(); ++r) {
    ASSERT_FALSE(job.procs[r].killed) << "rank " << r << " hung:\n" << job.procs[r].stderrText();
    ASSERT_EQ(job.procs[r].exitCode(), 0) << "rank " << r << ":\n" << job.procs[r].stderrText();
  }
}

// psTolerance: a 16-bit wire rounds each PS sum once for the way back (bf16: 2^-8 relative).
void expectCorrect(const Job& job, const std::map<std::string, std::string>& schemes, double psTolerance = 1e-6) {
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

TEST(MultiProcess, FourRanksAutoSchemeSynchronizesExactly) {
  Job job = startJob(4, 4, "sync", "auto", 3);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  expectCorrect(job, {{"tiny", "ps"}, {"conv", "ps"}, {"odd", "ps"}, {"even", "sfb"}, {"huge", "sfb"}});
}

// Priority-scheduled links (4 KB window: fragments) and the barrier waited for layer by layer give
// the same results: PS bit-exact, SFB within float error.
// The same seeds over FIFO links give bit-identical results: every layer's error is the same double.
TEST(MultiProcess, FourRanksPriorityLinksSynchronizeExactlyLayerByLayer) {
  Job job = startJob(4, 4, "priority", "auto", 3);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  expectCorrect(job, {{"tiny", "ps"}, {"conv", "ps"}, {"odd", "ps"}, {"even", "sfb"}, {"huge", "sfb"}});
  Job fifo = startJob(4, 4, "sync", "auto", 3);
  testing::waitAll(fifo.procs, std::chrono::seconds(120));
  expectAllSucceeded(fifo);
  for (int r = 0; r < 4; ++r) {
    auto a = report(job, r)["layers"], b = report(fifo, r)["layers"];
    ASSERT_EQ(a.size(), b.size());
    for (size_t l = 0; l < a.size(); ++l) {
      EXPECT_EQ(a[l]["max_rel_error"].get<double>(), b[l]["max_rel_error"].get<double>())
          << "rank " << r << " layer " << l;
      EXPECT_EQ(a[l]["bit_exact"], b[l]["bit_exact"]);
    }
  }
}

// A bf16 wire over priority-scheduled links (16-bit payloads in 4 KB fragments), as the bench's
// poseidon-overlap-bf16 runs: PS bit-exact against each gradient rounded, summed in fp32 in worker
// order and rounded once; SFB the product of the rounded factors; half of fp32's bytes per layer.
TEST(MultiProcess, FourRanksBf16WireSumsInFp32) {
  Job job = startJob(4, 4, "bf16", "auto", 3);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  expectCorrect(job, {{"tiny", "ps"}, {"conv", "ps"}, {"odd", "ps"}, {"even", "sfb"}, {"huge", "sfb"}}, 1.0 / 256);
  Job fp32 = startJob(4, 4, "priority", "auto", 3);
  testing::waitAll(fp32.procs, std::chrono::seconds(120));
  expectAllSucceeded(fp32);
  for (const std::string name : {"conv", "huge"}) {
    const std::string scheme = name == "conv" ? "ps" : "sfb";
    auto a = report(job, 0)["traffic"][name][scheme], b = report(fp32, 0)["traffic"][name][scheme];
    const double half = (a["sent"].get<double>() + a["received"].get<double>()) /
                        (b["sent"].get<double>() + b["received"].get<double>());
    EXPECT_GT(half, 0.5) << name;  // headers are not halved
    EXPECT_LT(half, name == "conv" ? 0.75 : 0.51) << name;
  }
}

// Bytes on the wire per layer and scheme against paper Table 1.
TEST(MultiProcess, FourRanksPsBytesMatchTable1) {
  const int iterations = 3, P = 4;
  Job job = startJob(P, P, "sync", "ps", iterations);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  expectCorrect(job, {{"even", "ps"}, {"huge", "ps"}});
  ModelDesc model = testing::scenarioModel();
  for (const std::string name : {"even", "huge"}) {
    const LayerSpec& l = model.layers[model.find(name)];
    double formula = psCostBoth(costInputs(l, testing::kScenarioBatch, P, P)) * iterations;
    double total = 0;
    for (int r = 0; r < P; ++r) {
      auto t = report(job, r)["traffic"][name]["ps"];
      double floats = (t["sent"].get<double>() + t["received"].get<double>()) / 4;
      total += floats;
      // "even" splits into 4 equal pairs, one per shard: every node moves the formula's amount.
      if (name == "even") {
        EXPECT_NEAR(floats / formula, 1.0, 0.05) << "rank " << r;
      }
    }
    // "huge" has a short last pair, so nodes differ; the mean node matches.
    EXPECT_NEAR(total / P / formula, 1.0, 0.05) << name << " measured " << total / P << " formula " << formula;
  }
}

TEST(MultiProcess, FourRanksSfbBytesMatchTable1) {
  const int iterations = 3, P = 4;
  Job job = startJob(P, P, "sync", "sfb", iterations);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  expectCorrect(job, {{"odd", "sfb"}, {"even", "sfb"}, {"huge", "sfb"}, {"conv", "ps"}});
  ModelDesc model = testing::scenarioModel();
  for (const std::string name : {"odd", "even", "huge"}) {
    const LayerSpec& l = model.layers[model.find(name)];
    double formula = sfbCost(costInputs(l, testing::kScenarioBatch, P, P)) * iterations;
    for (int r = 0; r < P; ++r) {
      auto t = report(job, r)["traffic"][name]["sfb"];
      double floats = (t["sent"].get<double>() + t["received"].get<double>()) / 4;
      // "odd" is tiny (7x13): its 48-byte headers are a larger share.
      EXPECT_NEAR(floats / formula, 1.0, name == std::string("odd") ? 0.35 : 0.05) << name << " rank " << r;
      EXPECT_EQ(report(job, r)["traffic"][name]["ps"]["sent"].get<double>(), 0) << name;
    }
  }
}

TEST(MultiProcess, SeparateServerRanks) {
  // Two workers and two server-only ranks.
  Job job = startJob(4, 4, "sync", "auto", 2, 20000,
                     {{1, {{"POSEIDON_ROLE", "server"}}}, {3, {{"POSEIDON_ROLE", "server"}}},
                      {0, {{"POSEIDON_ROLE", "worker"}}}, {2, {{"POSEIDON_ROLE", "worker"}}}});
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  for (int r : {0, 2}) {
    auto rep = report(job, r);
    EXPECT_EQ(rep["workers"], 2);
    EXPECT_EQ(rep["servers"], 2);
    for (const auto& L : rep["layers"]) {
      if (L["scheme"] == "ps") {
        EXPECT_TRUE(L["bit_exact"].get<bool>());
      }
      EXPECT_LT(L["max_rel_error"].get<double>(), 1e-5);
    }
  }
}

TEST(MultiProcess, ModelMismatchIsAClearErrorOnEveryRank) {
  Job job = startJob(4, 4, "mismatch", "auto", 1, 10000);
  testing::waitAll(job.procs, std::chrono::seconds(60));
  for (size_t r = 0; r < job.procs.size(); ++r) {
    EXPECT_FALSE(job.procs[r].killed) << r;
    EXPECT_EQ(job.procs[r].exitCode(), 1) << r;
    EXPECT_THAT(job.procs[r].stderrText(),
                HasSubstr("model mismatch between rank 0 and rank 2: layer 3 'even': fc weight[256x255]"))
        << r;
  }
}

TEST(MultiProcess, RankThatNeverJoinsTimesOutWithItsNumber) {
  // World of 4, but rank 3 is never started; a 3 s rendezvous timeout.
  Job job = startJob(3, 4, "sync", "auto", 1, 3000);
  testing::waitAll(job.procs, std::chrono::seconds(30));
  std::string expect = "waited 3 s for rank 3 to join coordinator at 127.0.0.1:" + std::to_string(job.port);
  for (size_t r = 0; r < job.procs.size(); ++r) {
    EXPECT_FALSE(job.procs[r].killed) << r;
    EXPECT_EQ(job.procs[r].exitCode(), 1) << r;
    EXPECT_THAT(job.procs[r].stderrText(), HasSubstr(expect)) << r;
    EXPECT_LT(job.procs[r].seconds, 3.0 * 2 + 1) << r;  // within its timeout (plus process start)
  }
}

TEST(MultiProcess, WorldSizeMismatchIsAClearError) {
  Job job = startJob(2, 2, "sync", "auto", 1, 5000, {{1, {{"WORLD_SIZE", "3"}}}});
  testing::waitAll(job.procs, std::chrono::seconds(30));
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(job.procs[r].exitCode(), 1) << r;
    EXPECT_THAT(job.procs[r].stderrText(),
                HasSubstr("world size mismatch: rank 1 was started with world size 3 but the coordinator (rank 0) has "
                          "world size 2"));
  }
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A rank's data endpoint and the job id, once it has joined (it writes them to a file).
std::pair<std::string, uint64_t> waitForEndpoint(const Job& job, int rank) {
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

// Garbage on a server's data port: random frames, truncated and oversized
// headers, unknown types and versions, frames for another job, and a raw
// non-ZeroMQ TCP connection. The job keeps training and its results are
// exact; every bad frame is counted and logged with the peer's address.
// Every rank waits for the gate file before it trains (test_node's POSEIDON_TEST_TRAIN_AFTER).
std::map<int, std::map<std::string, std::string>> trainAfter(const std::string& gate, int ranks) {
  std::map<int, std::map<std::string, std::string>> env;
  for (int r = 0; r < ranks; ++r) env[r] = {{"POSEIDON_TEST_TRAIN_AFTER", gate}};
  return env;
}

TEST(MultiProcess, BadFramesAreRejectedAndChangeNothing) {
  // The workers train once the garbage is sent (the gate), so it meets a running job.
  const std::string gate = testing::makeTempDir("gate") + "/go";
  Job job = startJob(4, 4, "slow-sync", "auto", 6, 20000, trainAfter(gate, 4));
  auto ep = waitForEndpoint(job, 1);
  const std::string endpoint = ep.first;
  const uint64_t jobId = ep.second;
  ASSERT_FALSE(endpoint.empty());

  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 2000);
  // An insider: it holds the job secret, so its garbage gets past the CURVE
  // handshake and reaches the frame decoders.
  CurveKeys keys = deriveCurveKeys(job.secret);
  makeCurveClient(s, keys);
  s.connect(endpoint);
  std::mt19937 rng(3);
  int sent = 0;
  auto sendParts = [&](std::vector<std::string> parts) {
    for (size_t i = 0; i < parts.size(); ++i)
      s.send(zmq::buffer(parts[i]), i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    ++sent;
  };
  auto randomBytes = [&](size_t n) {
    std::string b(n, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    return b;
  };
  for (int i = 0; i < 10000; ++i) {
    int frames = 1 + static_cast<int>(rng() % 3);
    std::vector<std::string> parts;
    for (int f = 0; f < frames; ++f) parts.push_back(randomBytes(rng() % 96));
    sendParts(parts);
  }
  auto header = [&](MsgType type, uint64_t job, uint64_t payload, uint16_t version = kWireVersion) {
    FrameHeader h;
    h.type = type;
    h.job = job;
    h.version = version;
    h.payloadBytes = payload;
    std::string b(kHeaderBytes, '\0');
    encodeHeader(h, reinterpret_cast<uint8_t*>(b.data()));
    return b;
  };
  std::string good = header(MsgType::kPsPush, jobId, 8);
  sendParts({good.substr(0, 47), std::string(8, 'x')});                            // truncated header
  sendParts({header(MsgType::kPsPush, jobId, uint64_t{1} << 40), std::string(8, 'x')});  // oversized
  sendParts({good, std::string(7, 'x')});                                          // payload shorter than header says
  sendParts({header(MsgType::kPsPush, jobId, 8, 7), std::string(8, 'x')});          // wrong version
  std::string unknown = good;
  unknown[6] = 77;
  sendParts({unknown, std::string(8, 'x')});                                        // unknown type
  sendParts({header(MsgType::kPsPush, jobId ^ 1, 8), std::string(8, 'x')});        // another job
  sendParts({header(MsgType::kPsPush, jobId, 8), std::string(8, 'x')});            // wrong length for any pair
  sendParts({header(MsgType::kJoin, jobId, 0), std::string()});                     // join on a data port
  // A raw TCP peer that does not speak ZeroMQ at all (half-open, then garbage).
  {
    std::string hostPort = endpoint.substr(6);
    std::string cmd = "exec 3<>/dev/tcp/" + hostPort.substr(0, hostPort.find(':')) + "/" +
                      hostPort.substr(hostPort.find(':') + 1) + " && head -c 4096 /dev/urandom >&3";
    EXPECT_EQ(std::system(("bash -c '" + cmd + "' 2>/dev/null").c_str()) == -1, false);
  }
  // The job trains only once the node has read the garbage: on a loaded machine this client's queue
  // and the node's receive loop can lag, and frames that reach the node after it finished are never
  // counted. Closing the context waits for the queue; then the node's log says when its 9001st
  // rejection happened (it logs every 1000th). Both wait at most the job's timeout.
  s.set(zmq::sockopt::linger, job.timeoutMs);
  s.close();
  ctx.close();
  testing::waitFor([&] { return job.procs[1].stderrText().find("(9001 rejected so far)") != std::string::npos; },
                   std::chrono::milliseconds(job.timeoutMs), {testing::directoryOf(job.procs[1].err)});
  std::ofstream(gate) << "go\n";
  testing::waitAll(job.procs, std::chrono::seconds(120));
  std::filesystem::remove_all(std::filesystem::path(gate).parent_path());
  expectAllSucceeded(job);
  expectCorrect(job, {});
  auto rep = report(job, 1);
  EXPECT_GE(rep["rejected_frames"].get<int>(), 8 + 10000 * 9 / 10) << "sent " << sent;
  EXPECT_THAT(job.procs[1].stderrText(), HasSubstr("rejected frame from 127.0.0.1"));
  EXPECT_THAT(job.procs[1].stderrText(), HasSubstr("bad magic"));
}

// Fault injection: SIGKILL or SIGSTOP one rank in the middle of training
// (mid-backward for a worker, mid-aggregation for a server shard) or during
// rendezvous. Every other rank must stop with an error naming what was lost,
// within 2x the 3 s timeout, and nothing may hang.
struct Fault {
  int victim;
  int signal;
};

// An event of a starting job that no file announces (a socket that accepts): within twice its timeout
// (the processes' start, then one timeout).
void waitUntil(const Job& job, const std::function<bool()>& ready, const char* what) {
  ASSERT_TRUE(testing::waitForPolled(ready, std::chrono::milliseconds(2 * job.timeoutMs)))
      << "never happened: " << what;
}

// Mid-training: every rank has joined (it writes its endpoint then), and the paced
// scenario's 400 iterations outlast the test.
void waitUntilTraining(const Job& job) {
  for (int r = 0; r < static_cast<int>(job.procs.size()); ++r) ASSERT_FALSE(waitForEndpoint(job, r).first.empty()) << r;
}

void expectSurvivorsFail(Job& job, const Fault& f, const std::string& expected,
                         const std::function<void()>& afterKill = nullptr) {
  ASSERT_EQ(kill(job.procs[f.victim].pid, f.signal), 0);
  auto t0 = std::chrono::steady_clock::now();
  if (afterKill) afterKill();
  std::vector<Proc> others;
  for (size_t r = 0; r < job.procs.size(); ++r)
    if (static_cast<int>(r) != f.victim) others.push_back(job.procs[r]);
  testing::waitAll(others, std::chrono::seconds(20));
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(job.procs[f.victim].pid, SIGKILL);  // a stopped victim is still there
  waitpid(job.procs[f.victim].pid, nullptr, 0);
  for (const auto& p : others) {
    EXPECT_FALSE(p.killed) << "a survivor hung:\n" << p.stderrText();
    EXPECT_EQ(p.exitCode(), 1) << p.stderrText();
    EXPECT_THAT(p.stderrText(), HasSubstr(expected));
  }
  EXPECT_LT(elapsed, 2 * 3.0 + 0.5) << "survivors took " << elapsed << " s";
}

TEST(FaultInjection, WorkerKilledMidBackward) {
  Job job = startJob(4, 4, "paced", "auto", 400, 3000);
  waitUntilTraining(job);
  expectSurvivorsFail(job, {2, SIGKILL}, "rank 2");
  for (int r : {0, 1, 3}) EXPECT_THAT(job.procs[r].stderrText(), ::testing::ContainsRegex("lost rank 2|rank 2 failed"));
}

TEST(FaultInjection, WorkerStoppedMidBackward) {
  Job job = startJob(4, 4, "paced", "auto", 400, 3000);
  waitUntilTraining(job);
  expectSurvivorsFail(job, {1, SIGSTOP}, "lost rank 1 (nothing from it for 3");
}

TEST(FaultInjection, ServerShardKilledMidAggregation) {
  Job job = startJob(4, 4, "paced", "ps", 400, 3000,
                     {{3, {{"POSEIDON_ROLE", "server"}}}, {0, {{"POSEIDON_ROLE", "worker"}}}});
  waitUntilTraining(job);
  expectSurvivorsFail(job, {3, SIGKILL}, "rank 3");
}

TEST(FaultInjection, ServerShardStoppedMidAggregation) {
  Job job = startJob(4, 4, "paced", "ps", 400, 3000, {{3, {{"POSEIDON_ROLE", "server"}}}});
  waitUntilTraining(job);
  expectSurvivorsFail(job, {3, SIGSTOP}, "lost rank 3");
}

// A rank whose program calls exit(0) mid-training (no destructor runs, finish() never comes): its
// peers stop with that reason as soon as it is gone, not "lost rank 1" after the timeout, which is
// set far beyond the test's wait so that only the rank's own word can end the others. From another
// thread, while the user's thread waits inside the node, the exit is as clean: the handler spares
// what that thread still uses.
void expectExitToldToPeers(bool fromThread) {
  std::map<std::string, std::string> exiting{{"POSEIDON_TEST_EXIT_AFTER", "2"}};
  if (fromThread) exiting["POSEIDON_TEST_EXIT_FROM_THREAD"] = "1";
  Job job = startJob(3, 3, "paced", "auto", 400, 120000, {{1, exiting}});
  testing::waitAll(job.procs, std::chrono::seconds(job.timeoutMs / 2000));
  const std::string said = "rank 1 left the job before finish() (its program exited)";
  ASSERT_FALSE(job.procs[1].killed) << "the exiting rank hung at exit:\n" << job.procs[1].stderrText();
  EXPECT_EQ(job.procs[1].exitCode(), 0) << job.procs[1].stderrText();
  EXPECT_THAT(job.procs[1].stderrText(), HasSubstr(said));
  for (int r : {0, 2}) {
    ASSERT_FALSE(job.procs[r].killed) << "rank " << r << " waited for the exited rank:\n" << job.procs[r].stderrText();
    EXPECT_EQ(job.procs[r].exitCode(), 1) << job.procs[r].stderrText();
    EXPECT_THAT(job.procs[r].stderrText(), HasSubstr(said));
    EXPECT_THAT(job.procs[r].stderrText(), ::testing::Not(HasSubstr("lost rank")));
  }
}

TEST(FaultInjection, WorkerThatExitsMidTrainingTellsItsPeersWhy) { expectExitToldToPeers(false); }

TEST(FaultInjection, WorkerExitingFromAnotherThreadWhileWaitingTellsItsPeersWhy) { expectExitToldToPeers(true); }

// Rank 3 is held back until rank 0 has been hit, so the rendezvous is still open when the
// coordinator goes; it then finds nobody answering either.
void coordinatorFailsDuringRendezvous(int signal, bool namesTheAddress) {
  std::string gate = testing::makeTempDir("gate") + "/go";
  Job job = startJob(4, 4, "paced", "auto", 10, 3000, {{3, {{"POSEIDON_TEST_START_AFTER", gate}}}});
  waitUntil(
      job, [&] { return testing::listening(job.port); }, "rank 0's coordinator listens");
  std::string expected = "no answer from the coordinator";
  if (namesTheAddress) expected += " at 127.0.0.1:" + std::to_string(job.port);
  expectSurvivorsFail(job, {0, signal}, expected, [&] { std::ofstream(gate) << "go\n"; });
  std::filesystem::remove_all(std::filesystem::path(gate).parent_path());
}

TEST(FaultInjection, CoordinatorKilledDuringRendezvous) {
  coordinatorFailsDuringRendezvous(SIGKILL, true);
}

TEST(FaultInjection, CoordinatorStoppedDuringRendezvous) {
  coordinatorFailsDuringRendezvous(SIGSTOP, false);
}

// Outsiders: a ZeroMQ client without CURVE, one with CURVE but keys from the
// wrong secret, and half-open raw TCP connections, all hammering a server
// port with well-formed pushes for the right job id. They are refused at
// the handshake and logged; no frame of theirs reaches the job, whose results
// stay exact.
TEST(JobSecret, OutsidersAreRefusedAndChangeNothing) {
  const std::string gate = testing::makeTempDir("gate") + "/go";
  Job job = startJob(2, 2, "slow-sync", "ps", 6, 20000, trainAfter(gate, 2));
  auto ep = waitForEndpoint(job, 1);
  const std::string endpoint = ep.first;
  const uint64_t jobId = ep.second;
  ASSERT_FALSE(endpoint.empty());
  zmq::context_t ctx(1);
  zmq::socket_t plain(ctx, zmq::socket_type::dealer), wrong(ctx, zmq::socket_type::dealer),
      leaked(ctx, zmq::socket_type::dealer);
  for (auto* s : {&plain, &wrong, &leaked}) s->set(zmq::sockopt::linger, 0);
  makeCurveClient(wrong, deriveCurveKeys("not the job secret"));
  // Someone who learned the servers' public key but not the secret: gets as
  // far as authentication, where the ZAP handler refuses its client key.
  char pub[41], sec[41];
  zmq_curve_keypair(pub, sec);
  leaked.set(zmq::sockopt::curve_serverkey, deriveCurveKeys(job.secret).serverPublic);
  leaked.set(zmq::sockopt::curve_publickey, std::string(pub));
  leaked.set(zmq::sockopt::curve_secretkey, std::string(sec));
  for (auto* s : {&plain, &wrong, &leaked}) s->connect(endpoint);
  // A push that would be accepted (right job, sender 0, pair 0 of layer 0, iteration 0) if it got in.
  FrameHeader h;
  h.type = MsgType::kPsPush;
  h.job = jobId;
  h.sender = 0;
  h.payloadBytes = 4;
  std::string head(kHeaderBytes, '\0');
  encodeHeader(h, reinterpret_cast<uint8_t*>(head.data()));
  float poison = 1e30f;
  for (int i = 0; i < 200; ++i) {
    for (auto* s : {&plain, &wrong, &leaked}) {
      s->send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      s->send(zmq::buffer(&poison, 4), zmq::send_flags::dontwait);
    }
  }
  std::string hostPort = endpoint.substr(6);
  std::string host = hostPort.substr(0, hostPort.find(':')), port = hostPort.substr(hostPort.find(':') + 1);
  for (int i = 0; i < 3; ++i) {
    // Half-open until the server has spoken (ZeroMQ's greeting starts with a 10-byte signature), then garbage.
    std::string cmd =
        "exec 3<>/dev/tcp/" + host + "/" + port + " && head -c 10 <&3 >/dev/null && head -c 1000 /dev/urandom >&3";
    EXPECT_EQ(std::system(("bash -c '" + cmd + "' 2>/dev/null").c_str()) == -1, false);
  }
  std::ofstream(gate) << "go\n";
  testing::waitAll(job.procs, std::chrono::seconds(120));
  std::filesystem::remove_all(std::filesystem::path(gate).parent_path());
  expectAllSucceeded(job);
  expectCorrect(job, {});  // bit-exact: the poison never got in
  auto rep = report(job, 1);
  EXPECT_GE(rep["refused_connections"].get<int>(), 3);
  EXPECT_EQ(rep["rejected_frames"].get<int>(), 0);  // nothing reached a decoder
  EXPECT_THAT(job.procs[1].stderrText(), HasSubstr("refused connection from 127.0.0.1: not a member of this job"));
  EXPECT_THAT(job.procs[1].stderrText(), HasSubstr("its handshake failed (it did not present this job's CURVE keys"));
}

TEST(JobSecret, RankWithAnotherSecretCannotJoin) {
  Job job = startJob(3, 3, "sync", "auto", 1, 3000, {{2, {{"POSEIDON_SECRET", "another secret"}}}});
  testing::waitAll(job.procs, std::chrono::seconds(30));
  for (int r : {0, 1}) {
    EXPECT_EQ(job.procs[r].exitCode(), 1);
    EXPECT_THAT(job.procs[r].stderrText(), HasSubstr("waited 3 s for rank 2 to join coordinator"));
    // The coordinator saw why: not a rank that never came, but one that came with another secret.
    EXPECT_THAT(job.procs[r].stderrText(),
                HasSubstr("connections were refused for not holding this job's secret: do all ranks share "
                          "POSEIDON_SECRET or POSEIDON_SECRET_FILE?)"));
  }
  EXPECT_EQ(job.procs[2].exitCode(), 1);
  EXPECT_THAT(job.procs[2].stderrText(), HasSubstr("with the same job secret?"));
  const std::string coordinator = job.procs[0].stderrText();
  EXPECT_THAT(coordinator, HasSubstr("refused a connection on coordinator 127.0.0.1:"));
  // The 1st, 10th, 100th... refusal is logged, not every retry of the rank outside.
  size_t lines = 0;
  for (size_t at = coordinator.find("refused a connection"); at != std::string::npos;
       at = coordinator.find("refused a connection", at + 1))
    ++lines;
  EXPECT_LE(lines, 3u) << coordinator;
}

// One worker 5x slower on every step, D = 1, a 100 ms straggler timeout: the
// others go at their own pace (5 layers x 20 ms + the wait), the slow one is
// dropped from rounds it is late for and skips iterations the others already
// finished, and every result equals the mean of exactly the contributions it
// reports (PS bit for bit).
TEST(Stragglers, DroppedWorkerDoesNotSetThePace) {
  Job job = startJob(4, 4, "straggler", "auto", 24, 20000);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  int excluded = 0;
  for (int r = 0; r < 4; ++r) {
    auto rep = report(job, r);
    EXPECT_TRUE(rep["ps_exact"].get<bool>()) << "rank " << r;
    EXPECT_LT(rep["sfb_max_rel_error"].get<double>(), 1e-5) << "rank " << r;
    excluded += rep["excluded_rounds"].get<int>();
    std::cout << "rank " << r << ": median iteration " << rep["median_iteration_seconds"] << " s, dropped "
              << rep["dropped"] << ", skipped " << rep["skipped"] << ", excluded rounds seen " << rep["excluded_rounds"]
              << "\n";
  }
  auto slow = report(job, 3);
  for (int r = 0; r < 3; ++r) {
    auto rep = report(job, r);
    // The straggler's pauses alone take 5 layers x 100 ms per iteration: ranks that waited for it would
    // take at least that (their own are 5 x 20 ms). A bound from the scenario, not from this machine.
    EXPECT_LT(rep["median_iteration_seconds"].get<double>(), 0.5) << "rank " << r;
    // A fast rank is dropped less than the slow one (now and then on a loaded machine, not never: a
    // 100 ms straggler timeout against scheduling delays).
    EXPECT_LT(rep["dropped"].get<int>() + rep["skipped"].get<int>(), slow["dropped"].get<int>() + slow["skipped"].get<int>())
        << "rank " << r;
  }
  EXPECT_GT(slow["dropped"].get<int>() + slow["skipped"].get<int>(), 0) << slow.dump();
  EXPECT_GT(slow["skipped"].get<int>(), 0) << slow.dump();
  EXPECT_GT(excluded, 0);
}

// The same with a bf16 wire: the contributor mask follows 16-bit floats; PS stays bit-exact against
// the rounded gradients of exactly the reported contributors, summed in fp32 and rounded once.
TEST(Stragglers, DroppingWorksOverABf16Wire) {
  Job job = startJob(4, 4, "straggler-bf16", "auto", 24, 20000);
  testing::waitAll(job.procs, std::chrono::seconds(120));
  expectAllSucceeded(job);
  int excluded = 0;
  for (int r = 0; r < 4; ++r) {
    auto rep = report(job, r);
    EXPECT_TRUE(rep["ps_exact"].get<bool>()) << "rank " << r;
    EXPECT_LT(rep["sfb_max_rel_error"].get<double>(), 1e-5) << "rank " << r;
    excluded += rep["excluded_rounds"].get<int>();
  }
  auto slow = report(job, 3);
  EXPECT_GT(slow["dropped"].get<int>() + slow["skipped"].get<int>(), 0) << slow.dump();
  EXPECT_GT(excluded, 0);  // results of partial contributor sets (the mask after 16-bit floats) were checked
}

}  // namespace
}  // namespace poseidon
