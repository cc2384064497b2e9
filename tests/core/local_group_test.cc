// Several ranks per machine (JobSettings::localRanks, client/local_group.h): the machine's ranks meet
// on a leader, which alone is a worker and a server on the network. Real nodes over localhost TCP, as
// node_inproc_test.cc; 2 machines x 2 ranks against the same 4 ranks each its own node (4 x 1).
#include <gtest/gtest.h>

#include <cmath>
#include <future>

#include "../integration/scenario.h"
#include "expect_error.h"
#include "poseidon/client/node.h"
#include "poseidon/launch/env.h"

namespace poseidon {
namespace {

using testing::kScenarioBatch;
using testing::scenarioModel;

NodeOptions optionsFor(int rank, int world, int port, int localRanks, SchemePolicy policy) {
  NodeOptions o;
  o.rank = rank;
  o.worldSize = world;
  o.masterPort = port;
  o.timeout = std::chrono::milliseconds(20000);
  o.settings.batch = kScenarioBatch;
  o.settings.pairBytes = testing::kScenarioPairBytes;
  o.settings.policy = policy;
  o.settings.localRanks = localRanks;
  return o;
}

// hosts: each rank's bind address (empty: 127.0.0.1 for all).
std::vector<std::unique_ptr<Node>> startNodes(int world, int localRanks, SchemePolicy policy,
                                              const std::vector<std::string>& hosts = {}) {
  const int port = freePort("127.0.0.1");
  std::vector<std::future<std::unique_ptr<Node>>> futures;
  for (int r = 0; r < world; ++r) {
    NodeOptions o = optionsFor(r, world, port, localRanks, policy);
    if (!hosts.empty()) o.van.bindHost = hosts[static_cast<size_t>(r)];
    futures.push_back(std::async(std::launch::async, [o] { return Node::start(o, scenarioModel()); }));
  }
  std::vector<std::unique_ptr<Node>> nodes;
  for (auto& f : futures) nodes.push_back(f.get());
  return nodes;
}

struct RankRun {
  std::vector<std::vector<float>> means;  // per layer, the last iteration's
  std::vector<Scheme> schemes;
  double maxRelError = 0;  // against the double mean over every rank, all iterations
};

// Every rank contributes the scenario's gradient (or factors) of its own rank number, so the mean is
// over all ranks whatever the machines: the reference of 4 x 1 and 2 x 2 is the same.
RankRun runRank(Node& node, int iterations) {
  const ModelDesc& model = node.book().model();
  const int world = node.book().worldSize(), me = node.rank();
  RankRun run;
  run.means.resize(model.layers.size());
  run.schemes.resize(model.layers.size());
  for (int64_t t = 0; t < iterations; ++t) {
    node.beginIteration(t);
    std::vector<std::vector<float>> us(model.layers.size()), vs(model.layers.size());
    for (int l = static_cast<int>(model.layers.size()) - 1; l >= 0; --l) {
      const LayerSpec& spec = model.layers[l];
      run.schemes[l] = node.schemeFor(l);
      run.means[l].assign(static_cast<size_t>(spec.numel()), 0.f);
      if (run.schemes[l] == Scheme::kSFB) {
        us[l] = testing::factorU(me, l, t, kScenarioBatch, spec.m);
        vs[l] = testing::factorV(me, l, t, kScenarioBatch, spec.n);
        node.submitFactors(l, us[l].data(), vs[l].data(), kScenarioBatch,
                           LayerBuffer::contiguous(run.means[l].data(), spec.numel()));
      } else {
        run.means[l] = testing::denseGradient(me, l, t, spec.numel());
        const int64_t first = spec.params.front().numel();  // weight and bias as two segments
        std::vector<FloatSpan> segs{{run.means[l].data(), first}};
        if (spec.numel() > first) segs.push_back({run.means[l].data() + first, spec.numel() - first});
        node.submitDense(l, LayerBuffer(segs));
      }
    }
    node.waitIteration();
    for (size_t l = 0; l < model.layers.size(); ++l) {
      const auto ref =
          testing::referenceMean(model.layers[l], run.schemes[l], world, t, static_cast<int>(l), kScenarioBatch);
      double worst = 0, scale = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        worst = std::max(worst, std::abs(run.means[l][i] - ref[i]));
        scale = std::max(scale, std::abs(ref[i]));
      }
      run.maxRelError = std::max(run.maxRelError, worst / scale);
    }
  }
  return run;
}

struct JobRun {
  std::vector<RankRun> ranks;
  std::vector<std::vector<uint64_t>> sentTo;  // [rank][dest]: gradient bytes, headers included
  std::vector<uint64_t> localBytes;           // per rank: local-push and local-result bytes sent
  std::vector<uint64_t> localHugeReceived;    // per rank: local bytes received for layer 4 ('huge')
  int workers = 0, servers = 0, localRanks = 0;
};

JobRun runJob(int world, int localRanks, SchemePolicy policy, int iterations,
              const std::vector<std::string>& hosts = {}) {
  auto nodes = startNodes(world, localRanks, policy, hosts);
  std::vector<std::future<RankRun>> futures;
  for (auto& n : nodes) {
    Node* node = n.get();
    futures.push_back(std::async(std::launch::async, [node, iterations] {
      RankRun r = runRank(*node, iterations);
      node->finish();
      return r;
    }));
  }
  JobRun job;
  for (auto& f : futures) job.ranks.push_back(f.get());
  for (auto& n : nodes) {
    std::vector<uint64_t> to;
    for (int d = 0; d < world; ++d) to.push_back(n->counters().dataSentTo(d));
    job.sentTo.push_back(to);
    job.localBytes.push_back(n->counters().total(TrafficKind::kLocal).bytesSent);
    job.localHugeReceived.push_back(n->counters().layer(4, TrafficKind::kLocal).bytesReceived);
  }
  job.workers = nodes[0]->book().numWorkers();
  job.servers = nodes[0]->book().numServers();
  job.localRanks = nodes[0]->book().localRanks();
  return job;
}

// Bytes that leave machine `m` of `perMachine` ranks: what its ranks send to the other machines' ranks.
uint64_t leaving(const JobRun& job, int m, int perMachine) {
  uint64_t n = 0;
  for (int r = m * perMachine; r < (m + 1) * perMachine; ++r)
    for (int d = 0; d < static_cast<int>(job.sentTo.size()); ++d)
      if (d / perMachine != m) n += job.sentTo[r][d];
  return n;
}

void expectSameMeans(const JobRun& a, const JobRun& b, double tolerance) {
  for (size_t r = 0; r < a.ranks.size(); ++r)
    for (size_t l = 0; l < a.ranks[r].means.size(); ++l) {
      const auto& x = a.ranks[r].means[l];
      const auto& y = b.ranks[r].means[l];
      double worst = 0, scale = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
        scale = std::max(scale, static_cast<double>(std::abs(y[i])));
      }
      EXPECT_LE(worst, tolerance * scale) << "rank " << r << " layer " << l;
    }
}

TEST(LocalRanks, TwoMachinesOfTwoMoveHalfThePsBytesAndStayExact) {
  const JobRun flat = runJob(4, 1, SchemePolicy::kPS, 3);
  const JobRun local = runJob(4, 2, SchemePolicy::kPS, 3);
  EXPECT_EQ(flat.workers, 4);
  EXPECT_EQ(local.workers, 2);  // the leaders, ranks 0 and 2
  EXPECT_EQ(local.servers, 2);
  for (int r = 0; r < 4; ++r) {
    EXPECT_LT(flat.ranks[r].maxRelError, 1e-6) << r;
    EXPECT_LT(local.ranks[r].maxRelError, 1e-6) << r;
    // A member holds its leader's mean, bit for bit (it gets the leader's copy).
    for (size_t l = 0; l < local.ranks[r].means.size(); ++l)
      EXPECT_EQ(local.ranks[r].means[l], local.ranks[r - r % 2].means[l]) << r << " layer " << l;
  }
  expectSameMeans(local, flat, 1e-6);
  // Per machine: (pushes to the other machine's shards + the sums back to its workers) x ranks on the
  // network. 4 x 1 sends both for each of its 2 ranks; 2 x 2 once for the machine: exactly half.
  for (int m = 0; m < 2; ++m) {
    EXPECT_GT(leaving(flat, m, 2), 0u);
    EXPECT_EQ(2 * leaving(local, m, 2), leaving(flat, m, 2)) << "machine " << m;
  }
  // Nothing but the members' local traffic goes from a member to another machine... or at all.
  for (int member : {1, 3}) {
    for (int d = 0; d < 4; ++d) EXPECT_EQ(local.sentTo[member][d], 0u) << member << " -> " << d;
    EXPECT_GT(local.localBytes[member], 0u);
  }
  EXPECT_EQ(flat.localBytes[1], 0u);
}

// SFB: the leader stacks its machine's factor sets (2 x 6 rows, U / 2) into one broadcast.
TEST(LocalRanks, SfbStacksTheMachinesFactorsAndStaysExact) {
  const JobRun flat = runJob(4, 1, SchemePolicy::kSFB, 2);
  const JobRun local = runJob(4, 2, SchemePolicy::kSFB, 2);
  ASSERT_EQ(local.ranks[0].schemes[4], Scheme::kSFB);  // huge
  ASSERT_EQ(local.ranks[1].schemes[4], Scheme::kSFB);
  for (int r = 0; r < 4; ++r) {
    EXPECT_LT(flat.ranks[r].maxRelError, 1e-5) << r;
    EXPECT_LT(local.ranks[r].maxRelError, 1e-5) << r;
    // Every replica rebuilds the same bits: each leader from the same stacks, each member its leader's.
    for (size_t l = 0; l < local.ranks[r].means.size(); ++l) {
      EXPECT_EQ(local.ranks[r].means[l], local.ranks[0].means[l]) << r << " layer " << l;
      EXPECT_EQ(flat.ranks[r].means[l], flat.ranks[0].means[l]) << r << " layer " << l;
    }
  }
  expectSameMeans(local, flat, 1e-5);
  // A member gets every leader's stack (2 x 12 rows x (301 + 211) floats an iteration), not the
  // 301 x 211 + 301 floats of the mean, and rebuilds the mean itself.
  // 2 iterations, each one chunk (12288 floats < 16384) with its header.
  const uint64_t stacks = 2 * (2 * 12 * (301 + 211) * 4 + kHeaderBytes);
  EXPECT_EQ(local.localHugeReceived[1], stacks);
  EXPECT_LT(local.localHugeReceived[1], 2u * (301 * 211 + 301) * 4);
  // 4 x 1: each rank's set to the other machine's 2 ranks (4 sets per machine); 2 x 2: one stacked set
  // of twice the rows to the other leader. The PS layers halve as above; only headers differ.
  for (int m = 0; m < 2; ++m) {
    const double ratio = static_cast<double>(leaving(local, m, 2)) / static_cast<double>(leaving(flat, m, 2));
    EXPECT_GT(ratio, 0.49) << m;
    EXPECT_LT(ratio, 0.51) << m;
  }
}

// --local-ranks 0: the ranks find their machine at rendezvous, by the host of their data endpoints.
// Two loopback addresses make two hosts here.
TEST(LocalRanks, ZeroFindsTheRanksOfEachHostAtRendezvous) {
  const JobRun two = runJob(4, 0, SchemePolicy::kAuto, 2, {"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"});
  EXPECT_EQ(two.localRanks, 2);
  EXPECT_EQ(two.workers, 2);
  for (int r = 0; r < 4; ++r) EXPECT_LT(two.ranks[r].maxRelError, 1e-5) << r;
  for (int d = 0; d < 4; ++d) EXPECT_EQ(two.sentTo[1][d], 0u);  // a member: nothing on the network
  // One host: one node, whose leader syncs with no one else.
  const JobRun one = runJob(3, 0, SchemePolicy::kAuto, 2);
  EXPECT_EQ(one.localRanks, 3);
  EXPECT_EQ(one.workers, 1);
  for (int r = 0; r < 3; ++r) EXPECT_LT(one.ranks[r].maxRelError, 1e-5) << r;
  JobSettings zero;
  zero.localRanks = 0;
  EXPECT_ERROR_CONTAINS(InformationBook(1,
                                        {{0, Role::kBoth, "tcp://10.0.0.1:5"},
                                         {1, Role::kBoth, "tcp://10.0.0.2:5"},
                                         {2, Role::kBoth, "tcp://10.0.0.1:6"},
                                         {3, Role::kBoth, "tcp://10.0.0.2:6"}},
                                        scenarioModel(), zero),
                        InvalidArgument,
                        "--local-ranks 0 (one node per host): the ranks of host 10.0.0.1 are not consecutive (rank 2 "
                        "follows ranks of host 10.0.0.2)");
  EXPECT_ERROR_CONTAINS(InformationBook(1,
                                        {{0, Role::kBoth, "tcp://10.0.0.1:5"},
                                         {1, Role::kBoth, "tcp://10.0.0.1:6"},
                                         {2, Role::kBoth, "tcp://10.0.0.2:5"}},
                                        scenarioModel(), zero),
                        InvalidArgument, "every host must hold as many ranks (10.0.0.1 has 2, 10.0.0.2 has 1)");
  // Every host its own rank: 0 resolves to 1, and nothing is refused for it.
  zero.groups = 1;
  InformationBook spread(1, {{0, Role::kBoth, "tcp://10.0.0.1:5"}, {1, Role::kBoth, "tcp://10.0.0.2:5"}},
                         scenarioModel(), zero);
  EXPECT_EQ(spread.localRanks(), 1);
  EXPECT_EQ(spread.numWorkers(), 2);
}

TEST(LocalRanks, RefusedSettings) {
  JobSettings two;
  two.localRanks = 2;
  EXPECT_ERROR_CONTAINS(
      InformationBook(1, {{0, Role::kBoth, "a"}, {1, Role::kBoth, "b"}, {2, Role::kBoth, "c"}}, scenarioModel(), two),
      InvalidArgument, "--local-ranks 2 must divide the 3 ranks");
  JobSettings groups;
  groups.localRanks = 2;
  groups.groups = 1;
  EXPECT_ERROR_CONTAINS(InformationBook(1, {{0, Role::kBoth, "a"}, {1, Role::kBoth, "b"}}, scenarioModel(), groups),
                        InvalidArgument, "--local-ranks 2 cannot be combined with --groups");
  JobSettings roles;
  roles.localRanks = 2;
  EXPECT_ERROR_CONTAINS(InformationBook(1, {{0, Role::kBoth, "a"}, {1, Role::kWorker, "b"}}, scenarioModel(), roles),
                        InvalidArgument, "every rank must be both worker and server (rank 1 is worker)");
  // The setting travels in the book, and a book with local ranks answers who leads whom.
  InformationBook book(1, {{0, Role::kBoth, "a"}, {1, Role::kBoth, "b"}, {2, Role::kBoth, "c"}, {3, Role::kBoth, "d"}},
                       scenarioModel(), roles);
  ByteWriter w;
  book.write(w);
  ByteReader r(w.bytes().data(), w.bytes().size());
  const InformationBook back = InformationBook::read(r);
  EXPECT_EQ(back.localRanks(), 2);
  EXPECT_EQ(back.workerRanks(), (std::vector<int>{0, 2}));
  EXPECT_EQ(back.leaderOf(3), 2);
  EXPECT_TRUE(back.isLocalMember(3));
  EXPECT_FALSE(back.isLocalMember(2));
  EXPECT_NE(back.settings().describe().find("local-ranks=2"), std::string::npos);
  // The field is the settings' last: a negative one is refused as it arrives.
  std::vector<uint8_t> bytes = w.bytes();
  std::fill(bytes.end() - 4, bytes.end(), 0xff);
  ByteReader bad(bytes.data(), bytes.size());
  EXPECT_ERROR_CONTAINS(InformationBook::read(bad), ProtocolError,
                        "job settings out of range: localRanks must be 0 (one node per host) or in [1, 4096], got -1");
}

}  // namespace
}  // namespace poseidon
