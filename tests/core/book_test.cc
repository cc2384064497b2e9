#include "poseidon/coordinator/book.h"

#include <gtest/gtest.h>

#include <functional>

#include "expect_error.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/model/zoo.h"

namespace poseidon {
namespace {

InformationBook makeBook(std::vector<Role> roles, const ModelDesc& m) {
  std::vector<NodeInfo> nodes;
  for (size_t r = 0; r < roles.size(); ++r) nodes.push_back({int(r), roles[r], "tcp://127.0.0.1:" + std::to_string(5000 + r)});
  JobSettings s;
  s.batch = 32;
  return InformationBook(42, nodes, m, s);
}

TEST(Book, RolesWorkersAndShards) {
  ModelDesc m = zooModel("lenet");
  InformationBook b = makeBook({Role::kBoth, Role::kWorker, Role::kServer, Role::kBoth}, m);
  EXPECT_EQ(b.workerRanks(), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(b.serverRanks(), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(b.workerIndex(3), 2);
  EXPECT_EQ(b.workerIndex(2), -1);
  EXPECT_EQ(b.shardIndex(2), 1);
  EXPECT_EQ(b.shardIndex(1), -1);
  EXPECT_EQ(b.layout().shards(), 3);
  LayerQuery q = b.query(m.find("ip1"));
  EXPECT_EQ(q.layer->name, "ip1");
  EXPECT_EQ(q.scheme, bestScheme(m.layers[q.index], 32, 3, 3));
}

TEST(Book, SerializationRoundTrip) {
  ModelDesc m = zooModel("googlenet");
  InformationBook b = makeBook({Role::kBoth, Role::kBoth}, m);
  ByteWriter w;
  b.write(w);
  auto bytes = w.take();
  ByteReader r(bytes.data(), bytes.size());
  InformationBook c = InformationBook::read(r);
  EXPECT_EQ(c.jobId(), 42u);
  EXPECT_EQ(c.model().hash(), m.hash());
  EXPECT_EQ(c.nodes()[1].endpoint, b.nodes()[1].endpoint);
  EXPECT_EQ(c.settings(), b.settings());
  // Every truncation is a clean ProtocolError, never a crash.
  for (size_t cut = 0; cut < bytes.size(); cut += 97) {
    ByteReader t(bytes.data(), cut);
    EXPECT_THROW(InformationBook::read(t), ProtocolError) << cut;
  }
}

// Settings a job cannot run with are refused as they arrive, the field and its value named: the
// ranges Node::start checks before the rendezvous (JobSettings::rangeError), one list for both.
TEST(Book, SettingsOutOfRangeAreRefusedByNameAsTheyArrive) {
  const ModelDesc m = zooModel("lenet");
  const std::vector<NodeInfo> nodes{{0, Role::kBoth, "tcp://a:1"}};
  const struct {
    std::function<void(JobSettings&)> set;
    std::string why;
  } cases[] = {
      {[](JobSettings& s) { s.batch = 0; }, "the batch must be at least 1, got 0"},
      {[](JobSettings& s) { s.startIteration = -2; }, "startIteration must be >= 0, got -2"},
      {[](JobSettings& s) { s.stragglerTimeoutMs = -1; }, "stragglerTimeoutMs must be >= 0, got -1"},
      {[](JobSettings& s) { s.staleness = -4; }, "staleness must be -1 (unbounded) or >= 0, got -4"},
      {[](JobSettings& s) { s.momentum = 1; }, "momentum must be in [0, 1), got 1"},
  };
  for (const auto& c : cases) {
    JobSettings s;
    c.set(s);
    EXPECT_EQ(s.rangeError(), c.why);
    ByteWriter w;
    InformationBook(7, nodes, m, s).write(w);
    ByteReader r(w.bytes().data(), w.bytes().size());
    EXPECT_ERROR_CONTAINS(InformationBook::read(r), ProtocolError, "job settings out of range: " + c.why);
  }
  EXPECT_EQ(JobSettings{}.rangeError(), "");
}

TEST(Book, WirePrecisionTravelsAndIsCheckedAgainstTheJob) {
  ModelDesc m = zooModel("lenet");
  std::vector<NodeInfo> nodes{{0, Role::kBoth, "tcp://a:1"}, {1, Role::kBoth, "tcp://b:1"}};
  JobSettings s;
  s.wire = WirePrecision::kBf16;
  InformationBook b(7, nodes, m, s);
  ByteWriter w;
  b.write(w);
  auto bytes = w.take();
  ByteReader r(bytes.data(), bytes.size());
  EXPECT_EQ(InformationBook::read(r).settings().wire, WirePrecision::kBf16);
  // The wire byte comes just before the settings' last field (local ranks, a u32): an unknown format
  // is a clean error.
  bytes[bytes.size() - 5] = 3;
  ByteReader bad(bytes.data(), bytes.size());
  EXPECT_ERROR_CONTAINS(InformationBook::read(bad), ProtocolError, "wire precision out of range");
  JobSettings fp32 = s;
  fp32.wire = WirePrecision::kFp32;
  EXPECT_FALSE(fp32 == s);  // ranks that disagree are refused at rendezvous
  EXPECT_NE(s.describe().find("wire=bf16"), std::string::npos);
  JobSettings adam = s;
  adam.policy = SchemePolicy::kAdam;
  EXPECT_ERROR_CONTAINS(InformationBook(7, nodes, m, adam), InvalidArgument,
                        "--wire bf16 does not apply to the adam baseline");
  JobSettings groups = s;
  groups.wire = WirePrecision::kFp16;
  groups.groups = 2;
  EXPECT_ERROR_CONTAINS(InformationBook(7, nodes, m, groups), InvalidArgument,
                        "--wire fp16 and --groups cannot be combined");
}

TEST(Book, NoWorkersOrNoServersIsAnError) {
  ModelDesc m = zooModel("lenet");
  EXPECT_THROW(makeBook({Role::kServer, Role::kServer}, m), InvalidArgument);
  EXPECT_THROW(makeBook({Role::kWorker, Role::kWorker}, m), InvalidArgument);
}

TEST(Book, JoinRoundTripAndHashCheck) {
  JoinRequest req;
  req.rank = 3;
  req.worldSize = 4;
  req.role = Role::kWorker;
  req.endpoint = "tcp://10.0.0.2:4000";
  req.model = zooModel("cifar10-quick");
  auto bytes = encodeJoin(req);
  JoinRequest d = decodeJoin(bytes.data(), bytes.size());
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.worldSize, 4);
  EXPECT_EQ(d.role, Role::kWorker);
  EXPECT_EQ(d.endpoint, req.endpoint);
  EXPECT_EQ(d.model.hash(), req.model.hash());
  ByteWriter settings;
  writeSettings(settings, req.settings);
  // Corrupt a dimension of the last layer (it ends 3 bytes before the settings that close the join).
  bytes[bytes.size() - settings.bytes().size() - 3] ^= 0x40;
  EXPECT_THROW(decodeJoin(bytes.data(), bytes.size()), ProtocolError);
}

TEST(Book, FirstDifferenceNamesTheLayer) {
  ModelDesc a = zooModel("vgg19"), b = a;
  b.layers[17] = LayerSpec::fc("fc7", 4096, 4000);
  auto diff = ModelDesc::firstDifference(a, b);
  ASSERT_TRUE(diff.has_value());
  EXPECT_NE(diff->find("layer 17 'fc7'"), std::string::npos) << *diff;
  EXPECT_NE(diff->find("4096x4000"), std::string::npos) << *diff;
  EXPECT_FALSE(ModelDesc::firstDifference(a, a).has_value());
  EXPECT_EQ(formatRanks({2, 3}), "2,3");
  EXPECT_EQ(formatRanks({1, 2, 3, 4, 7}), "1-4,7");
}

}  // namespace
}  // namespace poseidon
