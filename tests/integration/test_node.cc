// poseidon_test_node: one rank of a multi-process test. It reads its rank from
// the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) like
// a real trainer, runs a scenario over real ZeroMQ, and writes a JSON report
// to $OUT_DIR/rank<R>.json that the gtest side asserts on.
//
//   poseidon_test_node SCENARIO POLICY ITERATIONS OUT_DIR [TIMEOUT_MS]
//   scenarios: sync (the synthetic scenario), priority (sync over priority-scheduled links, waited
//   for layer by layer), bf16 (priority with a bf16 wire), mismatch (rank 2 changes a layer),
//              slow-sync (sync, with a pause before each iteration, for flood tests; with
//              POSEIDON_TEST_TRAIN_AFTER=FILE the workers start training once FILE exists),
//              paced (sync with a 10 ms pause before each layer's submit: fault tests),
//              straggler (20 ms per layer, worker 3 five times slower; drop 1, wait 100 ms),
//              straggler-bf16 (straggler with a bf16 wire)
//   env: POSEIDON_ROLE=worker|server|both, POSEIDON_SECRET (job secret),
//        POSEIDON_TEST_START_AFTER=FILE (start only once FILE exists: a test holds a rank back),
//        POSEIDON_TEST_EXIT_AFTER=N (a worker runs N iterations, then calls exit(0) without finish();
//        with POSEIDON_TEST_EXIT_FROM_THREAD=1 another thread calls it while this one waits on a barrier)
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include "events.h"
#include "poseidon/client/node.h"
#include "poseidon/common/log.h"
#include "poseidon/launch/env.h"
#include "scenario.h"

using namespace poseidon;

namespace {

// Waits for the test to create `gate` (a file), at most the job's timeout: past it the test has
// given up on this rank anyway.
void waitForGate(const char* gate, int timeoutMs, const char* what) {
  if (!testing::waitForChange(
          {testing::directoryOf(gate)}, [gate] { return std::ifstream(gate).good(); },
          std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs)))
    throw TimeoutError(strCat("the test never opened the ", what));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: poseidon_test_node SCENARIO POLICY ITERATIONS OUT_DIR [TIMEOUT_MS]\n";
    return 2;
  }
  std::string scenario = argv[1], outDir = argv[4];
  SchemePolicy policy = parseSchemePolicy(argv[2]);
  int iterations = std::atoi(argv[3]);
  int timeoutMs = argc > 5 ? std::atoi(argv[5]) : 20000;
  try {
    if (const char* gate = std::getenv("POSEIDON_TEST_START_AFTER")) {
      waitForGate(gate, timeoutMs, "start gate");
    }
    RankEnv env = rankFromEnvironment();
    setLogPrefix("rank " + std::to_string(env.rank));
    NodeOptions o;
    o.rank = env.rank;
    o.worldSize = env.worldSize;
    o.masterAddr = env.masterAddr;
    o.masterPort = env.masterPort;
    o.masterAddr = resolveHost(env.masterAddr);
    o.van.bindHost = std::getenv("POSEIDON_BIND") ? std::getenv("POSEIDON_BIND") : localAddressToward(o.masterAddr);
    o.timeout = std::chrono::milliseconds(timeoutMs);
    o.settings.batch = testing::kScenarioBatch;
    o.settings.pairBytes = testing::kScenarioPairBytes;
    o.settings.policy = policy;
    if (const char* role = std::getenv("POSEIDON_ROLE")) o.role = parseRole(role);
    o.secret = jobSecretFromEnvironment();
    // Priority-scheduled links with a 4 KB window: every 64 KB pair goes in 16 fragments.
    if (scenario == "priority" || scenario == "bf16") o.van.sendWindowBytes = 4096;
    if (scenario == "bf16") o.settings.wire = WirePrecision::kBf16;
    if (scenario == "straggler" || scenario == "straggler-bf16") {
      o.settings.dropStragglers = 1;
      o.settings.stragglerTimeoutMs = 100;
    }
    if (scenario == "straggler-bf16") o.settings.wire = WirePrecision::kBf16;
    ModelDesc model = testing::scenarioModel();
    if (scenario == "mismatch" && env.rank == 2) model.layers[3] = LayerSpec::fc("even", 256, 254);
    auto node = Node::start(o, model);
    {
      std::ofstream ep(outDir + "/endpoint" + std::to_string(env.rank));
      ep << node->endpoint() << "\n" << node->book().jobId() << "\n";
    }
    nlohmann::json report;
    report["rank"] = env.rank;
    if (node->isWorker()) {
      std::vector<testing::LayerCheck> checks;
      if (const char* gate = std::getenv("POSEIDON_TEST_TRAIN_AFTER")) {
        // The test opens the gate once its garbage is sent: the job is still running to take it.
        waitForGate(gate, timeoutMs, "training gate");
      }
      if (scenario == "straggler" || scenario == "straggler-bf16") {
        auto rep = testing::runStragglerScenario(*node, iterations, 20, 3);
        std::vector<double> t = rep.iterationSeconds;
        std::sort(t.begin(), t.end());
        report["median_iteration_seconds"] = t[t.size() / 2];
        report["ps_exact"] = rep.psExact;
        report["sfb_max_rel_error"] = rep.sfbMaxRelError;
        report["excluded_rounds"] = rep.excludedRounds;
        report["dropped"] = rep.dropped;
        report["skipped"] = rep.skipped;
      } else if (const char* exitAfter = std::getenv("POSEIDON_TEST_EXIT_AFTER")) {
        // A program that ends mid-training by exit(): no destructor runs, the node is never finished.
        testing::runScenario(*node, std::atoi(exitAfter), scenario == "paced" ? 10 : 0);
        if (!std::getenv("POSEIDON_TEST_EXIT_FROM_THREAD")) std::exit(0);
        // A watchdog's exit(): the user's thread is inside the node, waiting on an iteration that the
        // peers cannot complete without this rank's gradients, when the exit handler runs.
        node->beginIteration(node->iteration() + 1);
        std::thread([] { std::exit(0); }).detach();
        try {
          node->waitIteration();
        } catch (const std::exception& e) {
          std::cerr << "the waiting thread: " << e.what() << "\n";
        }
        for (;;) ::pause();  // the exit under way ends this process; a second one from here would race it
      } else {
        checks = testing::runScenario(*node, iterations, scenario == "paced" ? 10 : 0,
                                          scenario == "priority" || scenario == "bf16");
      }
      for (size_t l = 0; l < checks.size(); ++l) {
        report["layers"].push_back({{"scheme", schemeName(checks[l].scheme)},
                                    {"bit_exact", checks[l].bitExact},
                                    {"max_rel_error", checks[l].maxRelError}});
      }
    }
    node->finish();
    const ModelDesc& m = node->book().model();
    for (int l = 0; l < static_cast<int>(m.layers.size()); ++l) {
      for (auto kind : {TrafficKind::kPS, TrafficKind::kSFB}) {
        TrafficTotals t = node->counters().layer(l, kind);
        report["traffic"][m.layers[l].name][kind == TrafficKind::kPS ? "ps" : "sfb"] = {
            {"sent", t.bytesSent}, {"received", t.bytesReceived}, {"messages_sent", t.messagesSent}};
      }
    }
    report["rejected_frames"] = node->rejectedFrames();
    report["refused_connections"] = node->refusedConnections();
    report["workers"] = node->book().numWorkers();
    report["servers"] = node->book().numServers();
    std::ofstream out(outDir + "/rank" + std::to_string(env.rank) + ".json");
    out << report.dump(2);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank error: " << e.what() << "\n";
    return 1;
  }
}
