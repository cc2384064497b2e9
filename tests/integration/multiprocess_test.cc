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
#include "job.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using testing::Proc;
using testing::expectAllSucceeded;
using testing::expectCorrect;
using testing::Job;
using testing::report;
using testing::startJob;
using testing::trainAfter;
using testing::waitForEndpoint;

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

// Garbage on a server's data port: random frames, truncated and oversized
// headers, unknown types and versions, frames for another job, and a raw
// non-ZeroMQ TCP connection. The job keeps training and its results are
// exact; every bad frame is counted and logged with the peer's address.
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

}  // namespace
}  // namespace poseidon
