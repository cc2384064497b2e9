// poseidon bench at tiny scale, when this machine can build an emulated
// cluster (root, iproute2); skipped with the reason otherwise. The harness
// must never leave namespaces or qdiscs behind: on success (here), on Ctrl-C,
// a closed pipe and after its own death (bench_lifecycle_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench_cluster.h"
#include "poseidon/bench/cluster.h"
#include "poseidon/common/error.h"
#include "process.h"

namespace poseidon {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;
using testing::namespacesOf;


// `poseidon bench` of vgg19 at 100 Mbit/s with `flags`, its JSON to DIR/NAME.json and its output to
// DIR/NAME.log (into *out if given): the result, after checking that it exited 0 and left no namespace.
nlohmann::json runBench(const std::string& dir, const std::string& name, const std::vector<std::string>& flags,
                        std::string* out = nullptr) {
  std::vector<std::string> argv{POSEIDON_CLI, "bench", "--models", "vgg19",
                                "--rates",    "100",   "--json",   dir + "/" + name + ".json"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::vector<testing::Proc> procs{testing::spawn(argv, {}, dir + "/" + name + ".log")};
  testing::waitAll(procs, std::chrono::seconds(600));
  EXPECT_EQ(procs[0].exitCode(), 0) << procs[0].stdoutText() << procs[0].stderrText();
  EXPECT_TRUE(namespacesOf(procs[0].pid).empty());
  if (out) *out = procs[0].stdoutText();
  std::ifstream f(dir + "/" + name + ".json");
  return f ? nlohmann::json::parse(f) : nlohmann::json::object();
}

TEST(BenchSmoke, TwoNodesOneIterationPoseidonAndDdp) {
  POSEIDON_REQUIRE_CLUSTER();
  std::string dir = testing::makeTempDir("bench");
  // --ddp-python: DDP's ranks start in the interpreter named, here one that notes each start first.
  const std::string python = dir + "/python";
  std::ofstream(python) << "#!/bin/sh\necho \"$*\" >>" << dir << "/python.log\nexec /usr/bin/python3 \"$@\"\n";
  fs::permissions(python, fs::perms::owner_all);
  std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI,   "bench",
                                                   "--ddp-python", python,
                                                   "--models",     "vgg19",
                                                   "--systems",    "poseidon,ddp,ddp-tuned",
                                                   "--nodes",      "1,2",
                                                   "--rates",      "100",
                                                   "--iterations", "1",
                                                   "--warmup",     "0",
                                                   "--repeat",     "2",
                                                   "--compute",    "titanx,cpu:1",
                                                   "--trace",      dir + "/traces",
                                                   "--json",       dir + "/r.json",
                                                   "--markdown",   dir + "/r.md",
                                                   "--plots",      dir + "/plots"},
                                                  {}, dir + "/log")};
  testing::waitAll(procs, std::chrono::seconds(600));
  ASSERT_EQ(procs[0].exitCode(), 0) << procs[0].stdoutText() << procs[0].stderrText();
  std::ifstream f(dir + "/r.json");
  auto result = nlohmann::json::parse(f);
  // poseidon, poseidon@cpu:1, ddp, ddp-tuned at 1 and 2 nodes.
  ASSERT_EQ(result["runs"].size(), 8u);
  EXPECT_EQ(result["config"]["tcp_congestion_control"], "cubic");
  EXPECT_EQ(result["config"]["tcp_quickack"], false);
  EXPECT_EQ(result["config"]["timer_slack_ns"], 1);
  EXPECT_EQ(result["config"]["ddp_python"], python);
  {
    std::ifstream pf(dir + "/python.log");
    std::string line;
    int imports = 0, ranks = 0;
    while (std::getline(pf, line)) {
      imports += line == "-c import torch, torch.distributed";
      ranks += line.find("ddp_worker.py") != std::string::npos;
    }
    EXPECT_EQ(imports, 1);              // the check before any run
    EXPECT_GE(ranks, 2 * (1 + 2) * 2);  // ddp and ddp-tuned, at 1 and 2 nodes, 2 runs each (the tuning's more)
  }
  // vgg19's 32 x 0.1 = 3.2 rows a worker is not whole: it runs at width 3/32, its links at
  // (0.09375 / 0.1)^2 of the column's rate, the same full-width rate.
  const double width = result["config"]["model_scales"]["vgg19"].get<double>(), s2 = width * width;
  EXPECT_DOUBLE_EQ(width, 0.09375);
  EXPECT_EQ(result["config"]["batches"]["vgg19"]["scaled"], 3);
  for (const auto& r : result["runs"]) {
    EXPECT_NEAR(r["emulated_mbit"].get<double>(), r["link_mbit"].get<double>() * 0.9375 * 0.9375, 1e-9) << r.dump();
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    // Every rank, Poseidon's and DDP's, slept with the 1 ns slack it was started with (bench/ranks.h).
    EXPECT_EQ(r["timer_slack_ns"], 1) << r.dump();
    // The emulated compute alone is 0.9 s per iteration.
    EXPECT_GT(r["iteration_seconds"].get<double>(), 0.85) << r.dump();
    ASSERT_EQ(r["repeat_seconds"].size(), 2u) << r.dump();
    EXPECT_LE(r["min_seconds"].get<double>(), r["iteration_seconds"].get<double>());
    EXPECT_GE(r["max_seconds"].get<double>(), r["iteration_seconds"].get<double>());
    EXPECT_GE(r["slowest_rank_seconds"].get<double>(), r["min_seconds"].get<double>());
    EXPECT_GE(r["own_bound_seconds"].get<double>(), 0.85) << r.dump();
    const std::string system = r["system"];
    // Every rank reports its CPU time over the measured iterations.
    ASSERT_EQ(r["cpu_seconds_per_iteration"].size(), r["nodes"].get<size_t>()) << r.dump();
    EXPECT_GT(r["cpu_seconds_per_iteration"][0].get<double>(), 0) << r.dump();
    EXPECT_GT(r["host_cpu_share"].get<double>(), 0) << r.dump();
    if (r["nodes"] == 2) {
      EXPECT_GT(r["speedup"].get<double>(), 1.0) << r.dump();
      EXPECT_GT(r["tx_bytes_per_iteration"][1].get<double>(), 1e5) << r.dump();  // real bytes crossed the link
      if (system.rfind("poseidon", 0) == 0) {
        // Every byte that crossed a link was charged its full-width encryption, by the ranks themselves.
        EXPECT_GT(r["charged_seconds_per_iteration"]["crypto"].get<double>(), 0) << r.dump();
        EXPECT_GT(r["charged_seconds_per_iteration"]["gemm"].get<double>(), 0) << r.dump();  // vgg19's fc layers by SFB
        // BestScheme times both schemes on the device (10 Gbit/s at full width): fc6 saves more than its GEMM costs.
        EXPECT_EQ(r["fc_schemes"]["fc6"], "sfb") << r.dump();
        // The merged trace of both ranks: the emulated compute and fc6's factors leaving.
        std::ifstream tf(r["trace"].get<std::string>());
        std::string trace((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
        EXPECT_THAT(trace, HasSubstr("\"backward (emulated)\"")) << r["trace"];
        EXPECT_THAT(trace, HasSubstr("\"send fc6 (sfb)\"")) << r["trace"];
        EXPECT_TRUE(r.contains("tcp_retransmits")) << r.dump();
        EXPECT_GE(r["tcp_timeouts"].get<double>(), 0) << r.dump();
        EXPECT_TRUE(r["queue_drops"].contains("uplink") && r["queue_drops"].contains("downlink")) << r.dump();
      }
    }
    if (system.rfind("ddp", 0) == 0) {
      EXPECT_TRUE(r["charged_seconds_per_iteration"].is_null()) << r.dump();
      // DDP's caps scaled by s^2 like Poseidon's pairs: 25 MB and a 1 MB first bucket at full width.
      EXPECT_NEAR(r["first_bucket_mb"].get<double>(), s2, 1e-12) << r.dump();
      if (system == "ddp") {
        EXPECT_NEAR(r["bucket_mb"].get<double>(), 25 * s2, 1e-12) << r.dump();
      }
    }
    if (system == "ddp-tuned" && r["nodes"] == 2) {
      ASSERT_EQ(r["tuning"].size(), 3u) << r.dump();  // the sweep: 1, 5 and 25 MB at full width
      double best = 1e9, bestCap = 0;
      for (const auto& [cap, secs] : r["tuning"].items())
        if (!secs.is_null() && secs.get<double>() < best) best = secs.get<double>(), bestCap = std::stod(cap);
      EXPECT_NEAR(r["bucket_mb"].get<double>(), bestCap * s2, 1e-12) << r.dump();
    }
    if (system == "poseidon@cpu:1" && r["nodes"] == 2) {
      // One core reconstructs slower than a Titan X: more GEMM seconds than under the gpu model.
      for (const auto& g : result["runs"])
        if (g["system"] == "poseidon" && g["nodes"] == 2) {
          EXPECT_GT(r["charged_seconds_per_iteration"]["gemm"].get<double>(),
                    g["charged_seconds_per_iteration"]["gemm"].get<double>());
        }
    }
  }
  EXPECT_TRUE(fs::exists(dir + "/plots/speedup-vgg19-100mbit.png"));
  std::ifstream md(dir + "/r.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr("| poseidon |"));
  EXPECT_TRUE(namespacesOf(procs[0].pid).empty());
  fs::remove_all(dir);
}

// poseidon-overlap (docs/scheduling.md): priority-scheduled links and the forward waiting layer by
// layer; from the second iteration on the trace shows the gated forward and what it waits for.
// Each byte a vgg19 run's node 1 sent or received was charged its encryption at `cryptoBytes` per
// second at full width (s'^2 = 0.09375^2), within 20%.
void expectEncryptionChargedAt(const nlohmann::json& r, double cryptoBytes) {
  const double wire = (r["tx_bytes_per_iteration"][1].get<double>() + r["rx_bytes_per_iteration"][1].get<double>()) /
                      (0.09375 * 0.09375) / cryptoBytes;
  EXPECT_GT(r["charged_seconds_per_iteration"]["crypto"].get<double>(), 0.8 * wire) << r.dump();
  EXPECT_LT(r["charged_seconds_per_iteration"]["crypto"].get<double>(), 1.2 * wire) << r.dump();
}

TEST(BenchSmoke, OverlapTwoNodes) {
  POSEIDON_REQUIRE_CLUSTER();
  std::string dir = testing::makeTempDir("bench");
  std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI,      "bench",
                                                   "--models",        "vgg19",
                                                   "--systems",       "poseidon-overlap,poseidon-overlap-bf16",
                                                   "--nodes",         "2",
                                                   "--rates",         "100",
                                                   "--iterations",    "2",
                                                   "--warmup",        "1",
                                                   "--trace",         dir + "/traces",
                                                   "--machine-rates", "60,8,1.5",
                                                   "--json",          dir + "/r.json"},
                                                  {}, dir + "/log")};
  testing::waitAll(procs, std::chrono::seconds(600));
  ASSERT_EQ(procs[0].exitCode(), 0) << procs[0].stdoutText() << procs[0].stderrText();
  std::ifstream f(dir + "/r.json");
  auto result = nlohmann::json::parse(f);
  ASSERT_EQ(result["runs"].size(), 2u);
  // The same run with a bf16 wire (the -bf16 suffix): half the bytes on the interface.
  const auto& narrow = result["runs"][1];
  EXPECT_TRUE(narrow["ok"].get<bool>()) << narrow.dump();
  EXPECT_EQ(narrow["system"], "poseidon-overlap-bf16");
  const double half = narrow["tx_bytes_per_iteration"][1].get<double>() /
                      result["runs"][0]["tx_bytes_per_iteration"][1].get<double>();
  EXPECT_GT(half, 0.45) << narrow.dump();
  EXPECT_LT(half, 0.6) << narrow.dump();
  const auto& r = result["runs"][0];
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
  EXPECT_EQ(r["system"], "poseidon-overlap");
  EXPECT_GT(r["iteration_seconds"].get<double>(), 0.85) << r.dump();  // the emulated compute alone
  EXPECT_GT(r["tx_bytes_per_iteration"][1].get<double>(), 1e5) << r.dump();
  EXPECT_EQ(r["fc_schemes"]["fc6"], "sfb") << r.dump();
  // --machine-rates: no measuring; each byte each way is charged its encryption at the 1.5 GB/s given,
  // at full width (s'^2 = 0.09375^2).
  EXPECT_TRUE(result["config"]["machine_rates_given"].get<bool>());
  EXPECT_DOUBLE_EQ(result["config"]["machine_one_core"]["crypto_bytes_per_s"].get<double>(), 1.5e9);
  expectEncryptionChargedAt(r, 1.5e9);
  std::ifstream tf(r["trace"].get<std::string>());
  std::string trace((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  EXPECT_THAT(trace, HasSubstr("\"forward (emulated, layer by layer as the sync lands)\"")) << r["trace"];
  // Each rank pushes conv1_1 as its backward ends and its next forward starts with it: that wait is
  // a span of its own (a round trip at least, where no reply can be in yet).
  EXPECT_THAT(trace, HasSubstr("\"forward waits for conv1_1\"")) << r["trace"];
  EXPECT_THAT(trace, Not(HasSubstr("\"wait for the sync\""))) << r["trace"];  // no barrier in the loop
  // conv1_1's shard: each rank's push in, then its sum out, named with the last push's sender.
  EXPECT_THAT(trace, HasSubstr("\"push in from rank 0\"")) << r["trace"];
  EXPECT_THAT(trace, HasSubstr("\"push in from rank 1\"")) << r["trace"];
  EXPECT_THAT(trace, HasSubstr("\"shard sums conv1_1 pair 0 (last push from rank ")) << r["trace"];
  EXPECT_THAT(trace, HasSubstr("{\"name\":\"shard\"}")) << r["trace"];  // the lane's name
  EXPECT_EQ(result["config"]["host_queue"], "fifo");
  EXPECT_FALSE(result.contains("low_delay_bytes"));
  EXPECT_TRUE(namespacesOf(procs[0].pid).empty());
  fs::remove_all(dir);
}

// --urgent-layers 2: conv1_1's and conv1_2's data leave on the TOS-marked connections, and the nodes'
// two-band queues (--host-queue tos) send them in the low-delay band, as do the switch ports'
// (--switch-queue tos); the bulk does not go there (and unmarked traffic puts nothing there:
// LocalRanksAggregateOnTheNodeBeforeTheLink).
TEST(BenchSmoke, UrgentLayersGoFirstInTheNodesQueues) {
  POSEIDON_REQUIRE_CLUSTER();
  std::string dir = testing::makeTempDir("bench-urgent");
  std::string out;
  nlohmann::json result = runBench(dir, "r",
                                   {"--systems", "poseidon-overlap", "--nodes", "2", "--iterations", "1", "--warmup",
                                    "1", "--urgent-layers", "2", "--host-queue", "tos", "--switch-queue", "tos"},
                                   &out);
  ASSERT_EQ(result["runs"].size(), 1u);
  const auto& r = result["runs"][0];
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
  EXPECT_EQ(result["config"]["urgent_layers"], 2);
  EXPECT_EQ(result["config"]["host_queue"], "tos");
  EXPECT_GT(result["low_delay_bytes"].get<double>(), 0) << result["low_delay_bytes"];
  EXPECT_LT(result["low_delay_bytes"].get<double>(), r["tx_bytes_per_iteration"][1].get<double>())
      << result["low_delay_bytes"];
  EXPECT_THAT(out, HasSubstr("MB sent in the low-delay band"));
  // What the nodes sent marked, the switch ports sent on marked first (each node's peers' bytes).
  EXPECT_EQ(result["config"]["switch_queue"], "tos");
  EXPECT_GT(result["switch_low_delay_bytes"].get<double>(), 0) << result["switch_low_delay_bytes"];
  EXPECT_LT(result["switch_low_delay_bytes"].get<double>(), r["tx_bytes_per_iteration"][1].get<double>())
      << result["switch_low_delay_bytes"];
  EXPECT_THAT(out, HasSubstr("switch ports: "));
  fs::remove_all(dir);
}

// --host-queue pfifo_fast: Linux's default qdisc under each node's shaper, in the tree the runtime's
// probe reads for itself (EgressQueue.TheProbeReadsTheKernelsQdiscs: tbf > pfifo_fast serves the mark
// first), its packet limit the queue's bytes in full-size frames; the switch ports stay the tbf's FIFO.
TEST(BenchSmoke, PfifoFastNodesQueueUnderTheShaper) {
  POSEIDON_REQUIRE_CLUSTER();
  bench::EmulatedCluster cluster(2, bench::LinkSpec{30}, bench::EmulatedCluster::kDefaultTcpCongestion,
                                 bench::HostQueue::kPfifoFast);
  for (int i = 0; i < 2; ++i) {
    const std::string ns = cluster.nodeNamespace(i);
    const std::string qdiscs = bench::run({"ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "eth0"});
    EXPECT_THAT(qdiscs, HasSubstr("qdisc tbf 2: root")) << qdiscs;
    EXPECT_THAT(qdiscs, HasSubstr("qdisc pfifo_fast 20: parent 2:1 bands 3 priomap")) << qdiscs;
    // 100 ms at 30 Mbit/s is 375,000 bytes: 248 frames of 1514.
    EXPECT_THAT(bench::run({"ip", "-n", ns, "link", "show", "dev", "eth0"}), HasSubstr(" qlen 248")) << ns;
  }
  // A burst past the queue is dropped at the node, as with the FIFO: counted once (the tbf's line
  // holds its child's drops).
  bench::run({"ip", "netns", "exec", cluster.nodeNamespace(0), "bash", "-c",
              "for i in $(seq 600); do printf '%1400s' x > /dev/udp/" + cluster.nodeAddress(1) +
                  "/9 2>/dev/null || true; done"});
  const std::string stats =
      bench::run({"ip", "netns", "exec", cluster.nodeNamespace(0), "tc", "-s", "qdisc", "show", "dev", "eth0"});
  EXPECT_GT(cluster.queueDrops().uplink, 0u) << stats;
}

// --time-dilation 3: the links at a third of the rate, the compute and the charges three times as
// long, every time divided by 3 again. Poseidon's trace (real time) has each emulated forward and
// backward three times as long as the Titan X's; vgg19's iteration reads its undilated length for
// both Poseidon and DDP (0.90 s of compute at 2 nodes, where ~2.8 s is what a missing division would
// leave and ~1.8 s what DDP's ranks ignoring the dilation would: its all-reduce at a third of the
// rate outlasts its undilated backward), Poseidon's encryption is charged as at F = 1, the bounds use
// the undilated link, and the table says how it was made.
TEST(BenchSmoke, TimeDilationReportsTheUndilatedCluster) {
  POSEIDON_REQUIRE_CLUSTER();
  std::string dir = testing::makeTempDir("bench-dilation");
  nlohmann::json result =
      runBench(dir, "r",
               {"--systems", "poseidon,ddp", "--nodes", "2", "--iterations", "2", "--warmup", "1", "--time-dilation",
                "3", "--machine-rates", "60,8,1.5", "--markdown", dir + "/r.md", "--trace", dir + "/traces"});
  ASSERT_EQ(result["runs"].size(), 2u);
  EXPECT_DOUBLE_EQ(result["config"]["time_dilation"].get<double>(), 3);
  const double compute = 32 / 35.5;  // vgg19 on the Titan X (bench/emulation.cc): 1/3 forward, 2/3 backward
  for (const auto& run : result["runs"]) {
    EXPECT_TRUE(run["ok"].get<bool>()) << run.dump();
    EXPECT_GT(run["iteration_seconds"].get<double>(), 0.95 * compute) << run.dump();
    EXPECT_LT(run["iteration_seconds"].get<double>(), 1.6 * compute) << run.dump();
    EXPECT_NEAR(run["emulated_mbit"].get<double>(), 100 * (0.09375 / 0.1) * (0.09375 / 0.1), 1e-9) << run.dump();
    EXPECT_GE(run["own_bound_seconds"].get<double>(), 0.99 * compute) << run.dump();
  }
  const auto& r = result["runs"][0];
  EXPECT_EQ(r["system"], "poseidon");
  std::ifstream tf(r["trace"].get<std::string>());
  const nlohmann::json trace = nlohmann::json::parse(tf);
  int forwards = 0, backwards = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string name = e.value("name", "");
    if (name == "forward (emulated)") {
      ++forwards;
      EXPECT_GT(e["dur"].get<double>(), 0.95 * 3 * compute / 3 * 1e6) << e.dump();
    } else if (name == "backward (emulated)") {
      ++backwards;
      EXPECT_GT(e["dur"].get<double>(), 0.95 * 3 * compute * 2 / 3 * 1e6) << e.dump();
    }
  }
  EXPECT_EQ(forwards, 2 * 3);  // 2 ranks x (1 warm-up + 2 measured iterations)
  EXPECT_EQ(backwards, 2 * 3);
  expectEncryptionChargedAt(r, 1.5e9);
  std::ifstream md(dir + "/r.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr("**Time dilation 3** (--time-dilation)"));
  fs::remove_all(dir);
}

// Under time dilation the kernel's minimum retransmission timeout is dilated too: every node's route
// to the others carries it, and with --tcp-quickack the metric that turns the delayed ACK off.
TEST(BenchSmoke, RouteTimersAreSetOnEveryNodesRoute) {
  POSEIDON_REQUIRE_CLUSTER();
  bench::EmulatedCluster cluster(2, bench::LinkSpec{100});
  EXPECT_THAT(bench::run({"ip", "-n", cluster.nodeNamespace(1), "route", "show"}), Not(HasSubstr("rto_min")));
  cluster.setRouteTimers(600, false);
  for (int i = 0; i < 2; ++i) {
    const std::string routes = bench::run({"ip", "-n", cluster.nodeNamespace(i), "route", "show"});
    EXPECT_THAT(routes, HasSubstr("10.77.0.0/24 dev eth0"));
    EXPECT_THAT(routes, ContainsRegex("rto_min (lock )?600ms")) << routes;  // iproute2 may say "lock"
    EXPECT_THAT(routes, Not(HasSubstr("quickack"))) << routes;
  }
  // --tcp-quickack: the delayed ACK off, the minimum RTO kept; a later call without it turns it back on.
  cluster.setRouteTimers(200, true);
  for (int i = 0; i < 2; ++i) {
    const std::string routes = bench::run({"ip", "-n", cluster.nodeNamespace(i), "route", "show"});
    EXPECT_THAT(routes, ContainsRegex("rto_min (lock )?200ms")) << routes;
    EXPECT_THAT(routes, HasSubstr("quickack 1")) << routes;
  }
  cluster.setRouteTimers(200, false);
  EXPECT_THAT(bench::run({"ip", "-n", cluster.nodeNamespace(0), "route", "show"}), Not(HasSubstr("quickack")));
  EXPECT_THROW(cluster.setRouteTimers(0, true), InvalidArgument);
}

// What the runs' "queue_drops" read: the leaf qdiscs' drops, HTB's own line (the same drops again) not.
TEST(BenchSmoke, QueueDropsAreTheLeafQdiscsDrops) {
  const std::string tbf =
      "qdisc tbf 2: root refcnt 2 rate 30Mbit burst 16Kb lat 100ms\n"
      " Sent 123456 bytes 90 pkt (dropped 17, overlimits 40 requeues 0)\n"
      " backlog 0b 0p requeues 0\n";
  EXPECT_EQ(bench::leafQueueDrops(tbf), 17u);
  const std::string htb =
      "qdisc htb 2: root refcnt 2 r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000\n"
      " Sent 999 bytes 9 pkt (dropped 12, overlimits 3 requeues 0)\n"
      "qdisc bfifo 8001: parent 2:10 limit 400000b\n"
      " Sent 500 bytes 4 pkt (dropped 5, overlimits 0 requeues 0)\n"
      "qdisc bfifo 8002: parent 2:20 limit 400000b\n"
      " Sent 499 bytes 5 pkt (dropped 7, overlimits 0 requeues 0)\n";
  EXPECT_EQ(bench::leafQueueDrops(htb), 12u);
  EXPECT_EQ(bench::leafQueueDrops("qdisc noqueue 0: root refcnt 2\n Sent 0 bytes 0 pkt (dropped 0, overlimits 0)\n"),
            0u);
}

// A burst larger than a node's egress queue is dropped there (uplink), not at the switch port.
TEST(BenchSmoke, QueueDropsAreCountedWhereTheyHappen) {
  POSEIDON_REQUIRE_CLUSTER();
  bench::EmulatedCluster cluster(2, bench::LinkSpec{1, 0, 10});  // 1 Mbit/s, 10 ms of queue: ~1.3 KB
  EXPECT_EQ(cluster.queueDrops().uplink, 0u);
  // 200 datagrams of 1400 bytes at once from node 0 to node 1 (nothing listens: they still cross).
  bench::run({"ip", "netns", "exec", cluster.nodeNamespace(0), "bash", "-c",
              "for i in $(seq 200); do printf '%1400s' x > /dev/udp/" + cluster.nodeAddress(1) +
                  "/9 2>/dev/null || true; done"});
  const auto drops = cluster.queueDrops();
  EXPECT_GT(drops.uplink, 100u);  // the tbf passes its bucket and ~1.3 KB of queue, drops the rest
  EXPECT_EQ(drops.downlink, 0u);  // what passed the uplink's rate fits the switch port's
}

// --local-ranks 2: each node runs two ranks, each its own process. Poseidon's aggregate on the node's
// first rank, so what leaves a node of 2 x 2 is what leaves a node of 2 x 1 (the PS pairs once per
// node) but for vgg19's SFB factors, stacked from both ranks; a node's bytes are counted once, and
// images/s counts every rank. One node of two ranks sends nothing over its link.
TEST(BenchSmoke, LocalRanksAggregateOnTheNodeBeforeTheLink) {
  POSEIDON_REQUIRE_CLUSTER();
  std::string dir = testing::makeTempDir("bench-local");
  auto bench = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--iterations", "1", "--warmup", "0"});
    return runBench(dir, name, extra);
  };
  nlohmann::json local = bench("local", {"--systems", "poseidon,ddp", "--nodes", "1,2", "--local-ranks", "2"});
  // The two-band node queue changes nothing for traffic that is not marked: none of it is low-delay.
  nlohmann::json flat =
      bench("flat", {"--systems", "poseidon", "--nodes", "2", "--host-queue", "tos", "--switch-queue", "tos"});
  EXPECT_EQ(flat["low_delay_bytes"], 0) << flat.dump();
  EXPECT_EQ(flat["switch_low_delay_bytes"], 0) << flat.dump();
  EXPECT_EQ(local["config"]["local_ranks"], 2);
  ASSERT_EQ(local["runs"].size(), 4u);
  double localTx = 0;
  for (const auto& r : local["runs"]) {
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["local_ranks"], 2) << r.dump();
    const int nodes = r["nodes"].get<int>();
    ASSERT_EQ(r["cpu_seconds_per_iteration"].size(), static_cast<size_t>(2 * nodes)) << r.dump();  // every rank
    ASSERT_EQ(r["tx_bytes_per_iteration"].size(), static_cast<size_t>(nodes)) << r.dump();         // every node
    EXPECT_NEAR(r["images_per_sec"].get<double>(), 2 * nodes * 3 / r["iteration_seconds"].get<double>(), 1e-6)
        << r.dump();
    if (nodes == 1) {
      EXPECT_LT(r["tx_bytes_per_iteration"][0].get<double>(), 1e4) << r.dump();
    }
    if (nodes == 2 && r["system"] == "poseidon") localTx = r["tx_bytes_per_iteration"][1].get<double>();
  }
  ASSERT_EQ(flat["runs"].size(), 1u);
  const double flatTx = flat["runs"][0]["tx_bytes_per_iteration"][1].get<double>();
  ASSERT_GT(flatTx, 1e5);
  // Without the aggregation both ranks of a node would send their pushes and SFB factors: about twice.
  EXPECT_GT(localTx / flatTx, 0.95);
  EXPECT_LT(localTx / flatTx, 1.4);
  fs::remove_all(dir);
}

// Every node's TCP runs the congestion control asked for (cubic unless told), whatever the host's is,
// and one the kernel lacks is refused with the kernel's list before anything is made.
TEST(BenchSmoke, NodesRunTheNamedCongestionControl) {
  POSEIDON_REQUIRE_CLUSTER();
  auto nodeCc = [](const bench::EmulatedCluster& c, int i) {
    std::string out =
        bench::run({"ip", "netns", "exec", c.nodeNamespace(i), "sysctl", "-n", "net.ipv4.tcp_congestion_control"});
    return out.substr(0, out.find_last_not_of(" \n") + 1);
  };
  {
    bench::EmulatedCluster cubic(2, bench::LinkSpec{100});
    EXPECT_EQ(cubic.tcpCongestion(), "cubic");
    EXPECT_EQ(nodeCc(cubic, 0), "cubic");
    EXPECT_EQ(nodeCc(cubic, 1), "cubic");
  }
  {
    bench::EmulatedCluster reno(2, bench::LinkSpec{100}, "reno");  // reno is built into every kernel
    EXPECT_EQ(nodeCc(reno, 0), "reno");
    EXPECT_EQ(nodeCc(reno, 1), "reno");
  }
  try {
    bench::EmulatedCluster none(2, bench::LinkSpec{100}, "nosuchcc");
    ADD_FAILURE() << "a congestion control the kernel lacks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("TCP congestion control 'nosuchcc' is not available on this kernel "
                                    "(/proc/sys/net/ipv4/tcp_available_congestion_control: "));
    EXPECT_THAT(e.what(), HasSubstr("reno"));
  }
  EXPECT_TRUE(namespacesOf(getpid()).empty());
}


}  // namespace
}  // namespace poseidon
