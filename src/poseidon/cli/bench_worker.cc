// poseidon bench-worker: one rank of the emulated-cluster benchmark on the
// Poseidon side. Forward and backward are waits of the emulated model's
// per-layer times (absolute deadlines, so sync work on other threads never
// stretches the emulated GPU); gradients and factors have the real scaled
// shapes. Started by `poseidon bench` inside a node's network namespace with
// the torchrun environment; writes one JSON result file.
#include <sys/resource.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "poseidon/bench/device.h"
#include "poseidon/bench/emulation.h"
#include "poseidon/bench/systems.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/client/node.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/common/trace.h"
#include "poseidon/launch/env.h"

namespace poseidon::cli {
namespace {

// CPU seconds of this process so far, every thread (user + system).
double cpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// TCP segments this network namespace retransmitted so far (/proc/net/snmp is per namespace): the
// sign of drops in the shaped links' queues (incast).
uint64_t tcpRetransmits() {
  std::ifstream f("/proc/net/snmp");
  std::string header, values, line;
  while (std::getline(f, line)) {
    if (line.rfind("Tcp:", 0) != 0) continue;
    if (header.empty()) header = line;
    else values = line;
  }
  std::istringstream h(header), v(values);
  std::string name, value;
  while (h >> name && v >> value)
    if (name == "RetransSegs") return std::stoull(value);
  return 0;
}

uint64_t readCounter(const std::string& iface, const char* which) {
  if (iface.empty()) return 0;
  std::ifstream f("/sys/class/net/" + iface + "/statistics/" + which);
  uint64_t v = 0;
  f >> v;
  return v;
}

}  // namespace

int benchWorkerCommand(const std::vector<std::string>& args) {
  std::string model = "vgg19", system = "poseidon", out, iface, bind, wireFlag = "fp32";
  double scale = 0.1;
  int iterations = 8, warmup = 3, timeoutMs = 120000;
  int64_t pairBytes = -1;
  std::string device = "none", tracePath;
  double gemmFlops = 0, sumBytes = 0, cryptoBytes = 0, linkMbit = 0;
  int rcvbuf = 0, sendWindow = 0, ioThreads = NodeOptions{}.ioThreads;
  bool overlapForward = false;
  FlagSet flags("bench-worker", "poseidon bench-worker --model NAME --system SYS --out FILE [flags]",
                "One rank of 'poseidon bench' (started by it; not meant to be run by hand).");
  flags.addString("model", &model, "emulated model", "NAME");
  flags.addDouble("scale", &scale, "width scale s", "S", RealRange::leftOpen(0, 1));
  flags.addString("system", &system,
                  "poseidon | poseidon-overlap | ps-wfbp | ps-naive | adam | sfb; all but adam optionally with "
                  "-bf16 or -fp16", "SYS");
  flags.addString("wire", &wireFlag, "what gradients travel as: fp32 | bf16 | fp16 (default: the system's suffix, "
                  "else fp32)", "P");
  flags.addInt("iterations", &iterations, "measured iterations", "N", IntRange::atLeast(1));
  flags.addInt("warmup", &warmup, "unmeasured iterations first", "N", IntRange::atLeast(0));
  flags.addString("out", &out, "result JSON file", "FILE");
  flags.addString("iface", &iface, "network interface whose byte counters to read", "DEV");
  flags.addString("bind", &bind, "data endpoint address", "ADDR");
  flags.addInt("timeout", &timeoutMs, "timeout of every wait (ms)", "MS", IntRange::atLeast(1));
  flags.addInt64("pair-bytes", &pairBytes, "KV pair size (default: 2 MB x s^2, the scaling rule)", "BYTES",
                 IntRange::closed(kMinPairBytes, kMaxPairBytes));
  // The device model (bench/device.h): the harness measures the rates once and passes them on.
  flags.addString("device", &device, "name of the device model (for the result)", "NAME");
  flags.addDouble("gemm-flops", &gemmFlops, "charge the reconstruction GEMM at full width at this FLOP/s (0: not)",
                  "R", RealRange::atLeast(0));
  flags.addDouble("sum-bytes", &sumBytes, "charge the servers' sums at full width at this byte/s (0: not)", "R",
                  RealRange::atLeast(0));
  flags.addDouble("crypto-bytes", &cryptoBytes, "charge CURVE encryption at full width at this byte/s (0: not)",
                  "R", RealRange::atLeast(0));
  flags.addString("trace", &tracePath, "write a Chrome trace of this rank (compute, sends, receives) to FILE",
                  "FILE");
  flags.addInt("tcp-rcvbuf", &rcvbuf, "TCP receive buffer per connection into this rank (0: OS default)", "BYTES",
               IntRange::closed(0, 1 << 30));
  flags.addInt("io-threads", &ioThreads, "ZeroMQ I/O threads (encryption is charged on them)", "N",
               IntRange::closed(1, 64));
  flags.addInt("send-window", &sendWindow,
               "priority scheduling of the links with this kernel send window per connection (0: FIFO)", "BYTES",
               IntRange::closed(0, 1 << 30));
  flags.addBool("overlap-forward", &overlapForward,
                "run each layer's next forward as soon as its sync is in, not after the whole barrier");
  flags.addDouble("link-mbit", &linkMbit,
                  "the link rate, for BestScheme to weigh the GEMM against the bytes (0: bytes alone decide)",
                  "MBIT", RealRange::atLeast(0));
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  if (out.empty()) throw InvalidArgument("--out is required");
  if ((overlapForward || system.rfind("poseidon-overlap", 0) == 0) && warmup < 1) {
    throw InvalidArgument("--overlap-forward needs --warmup 1 or more (each iteration carries the one before's tail)");
  }
  bench::EmulatedModel em = bench::emulatedModel(model, scale);
  DeviceModel dm;
  dm.name = device;
  // K is rounded at scale s (vgg19: 32 x 0.1 -> 3): scale the GEMM back by the batch actually used.
  dm.flopScale = static_cast<double>(em.fullBatch) / static_cast<double>(em.batch) / (scale * scale);
  dm.byteScale = 1.0 / (scale * scale);
  dm.gemmFlops = gemmFlops;
  dm.sumBytes = sumBytes;
  dm.cryptoBytes = cryptoBytes;
  // The emulated link is the full-width one slowed by s^2: BestScheme compares full-width bytes.
  dm.linkBytes = linkMbit * 1e6 / 8 * dm.byteScale;
  dm.cryptoLanes = ioThreads;
  // This rank's node charges its own work on it (common/work_charger.h).
  bench::ChargedDevice charger(dm);
  // A wire suffix (poseidon-bf16) picks the wire; the rest picks the scheme and the overlap.
  const bench::SystemChoice parsed = bench::parseBenchSystem(system);  // bench/systems.h
  if (parsed.spec->ddp) {
    throw InvalidArgument("unknown system '" + system + "' (bench-worker runs Poseidon's; DDP's run in ddp_worker.py)");
  }
  if (flags.wasSet("wire") && parsed.wire != WirePrecision::kFp32) {
    throw InvalidArgument("--wire and a system with a wire suffix ('" + system + "') cannot be combined");
  }
  const WirePrecision wirePrecision = flags.wasSet("wire") ? parseWirePrecision(wireFlag) : parsed.wire;
  const std::string systemName = system;  // as asked, for the result
  system = parsed.base();
  const SchemePolicy policy = parsed.spec->policy;
  const bool overlap = parsed.spec->wfbp;
  if (parsed.spec->overlapForward) {
    // docs/scheduling.md: priority-scheduled links, each layer's next forward as soon as its sync
    // lands. The window: 1 MB at full width (half a KV pair), scaled by s^2 like the pairs.
    overlapForward = true;
    if (!flags.wasSet("send-window")) {
      sendWindow = static_cast<int>(std::max(4096.0, std::round(1048576 * scale * scale)));
    }
  }

  RankEnv env = rankFromEnvironment();
  setLogPrefix("rank " + std::to_string(env.rank));  // like every rank's: the harness drops it from its report
  NodeOptions o;
  o.rank = env.rank;
  o.worldSize = env.worldSize;
  o.masterAddr = resolveHost(env.masterAddr);
  o.masterPort = env.masterPort;
  o.bindHost = bind.empty() ? localAddressToward(o.masterAddr) : bind;
  o.timeout = std::chrono::milliseconds(timeoutMs);
  o.settings.batch = em.batch;
  // The paper's 2 MB pairs at full width; the same number of pairs per layer at scale s.
  o.settings.pairBytes = flags.wasSet("pair-bytes")
                             ? pairBytes
                             : std::max<int64_t>(4096, std::llround(2.0 * 1024 * 1024 * scale * scale));
  o.settings.policy = policy;
  o.settings.wire = wirePrecision;
  o.secret = jobSecretFromEnvironment();
  o.receiveBufferBytes = rcvbuf;
  o.ioThreads = ioThreads;
  o.charger = &charger;
  o.sendWindowBytes = sendWindow;
  std::unique_ptr<Tracer> tracer;
  if (!tracePath.empty()) tracer = std::make_unique<Tracer>(env.rank);
  o.tracer = tracer.get();
  auto node = Node::start(o, em.desc);

  const auto& layers = em.desc.layers;
  const int L = static_cast<int>(layers.size());
  std::mt19937 rng(static_cast<unsigned>(env.rank + 1));
  std::uniform_real_distribution<float> dist(-1e-3f, 1e-3f);
  std::vector<std::vector<float>> grads(L), us(L), vs(L), outs(L);
  for (int l = 0; l < L; ++l) {
    grads[l].resize(static_cast<size_t>(layers[l].numel()));
    for (auto& x : grads[l]) x = dist(rng);
    if (layers[l].type == LayerType::kFC) {
      us[l].resize(static_cast<size_t>(em.batch * layers[l].m));
      vs[l].resize(static_cast<size_t>(em.batch * layers[l].n));
      for (auto& x : us[l]) x = dist(rng);
      for (auto& x : vs[l]) x = dist(rng);
      outs[l].resize(grads[l].size());
    }
  }
  auto submit = [&](int l) {
    if (layers[l].type == LayerType::kFC && node->schemeFor(l) != Scheme::kPS) {
      node->submitFactors(l, us[l].data(), vs[l].data(), em.batch,
                          LayerBuffer::contiguous(outs[l].data(), static_cast<int64_t>(outs[l].size())));
    } else {
      node->submitDense(l, LayerBuffer::contiguous(grads[l].data(), static_cast<int64_t>(grads[l].size())));
    }
  };

  using Clock = std::chrono::steady_clock;
  auto toDuration = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  double forwardTotal = 0;
  for (double f : em.forwardSeconds) forwardTotal += f;
  std::vector<double> times;
  uint64_t tx0 = 0, rx0 = 0;
  TrafficTotals psStart, sfbStart, adamStart;
  bench::ChargedSeconds chargedStart;
  double cpu0 = 0;
  uint64_t retrans0 = 0;
  // An iteration runs from the start of its forward pass to the end of its backward and, with the
  // barrier, its sync. With --overlap-forward its forward waits layer by layer for the previous
  // iteration's sync (so it carries that iteration's tail, as every iteration in a steady state
  // does), and the last one's tail is drained unmeasured.
  for (int it = 0; it < warmup + iterations; ++it) {
    if (it == warmup) {  // with --overlap-forward, the warm-up's tail is in flight: counted, as a steady state's
      tx0 = readCounter(iface, "tx_bytes");
      rx0 = readCounter(iface, "rx_bytes");
      psStart = node->counters().total(TrafficKind::kPS);
      sfbStart = node->counters().total(TrafficKind::kSFB);
      adamStart = node->counters().total(TrafficKind::kAdam);
      chargedStart = charger.charged();
      cpu0 = cpuSeconds();
      retrans0 = tcpRetransmits();
    }
    auto t0 = Clock::now();
    const int64_t forwardUs = Tracer::nowMicros();
    auto deadline = t0;
    if (overlapForward && it > 0) {
      for (int l = 0; l < L; ++l) {
        // Layer l's update of iteration it - 1. Only a real wait moves the emulated GPU's clock (an
        // oversleep of the previous layer must not add up over a few hundred layers).
        if (!node->layerReady(l)) {
          node->waitLayer(l);
          deadline = std::max(deadline, Clock::now());
        }
        deadline += toDuration(em.forwardSeconds[l]);
        std::this_thread::sleep_until(deadline);
      }
    } else {
      deadline += toDuration(forwardTotal);
      std::this_thread::sleep_until(deadline);
    }
    node->beginIteration(it);
    const int64_t backwardUs = Tracer::nowMicros();
    if (tracer) {
      tracer->span(overlapForward && it > 0 ? "forward (emulated, layer by layer as the sync lands)"
                                            : "forward (emulated)",
                   "compute", 0, forwardUs, backwardUs, it);
    }
    for (int l = L - 1; l >= 0; --l) {
      deadline += toDuration(em.backwardSeconds[l]);
      std::this_thread::sleep_until(deadline);
      if (overlap) submit(l);
    }
    const int64_t waitUs = Tracer::nowMicros();
    if (tracer) tracer->span("backward (emulated)", "compute", 0, backwardUs, waitUs, it);
    if (!overlap)
      for (int l = L - 1; l >= 0; --l) submit(l);
    if (!overlapForward) {
      node->waitIteration();
      if (tracer) tracer->span("wait for the sync", "wait", 0, waitUs, Tracer::nowMicros(), it);
    }
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  nlohmann::json schemes = nlohmann::json::object();
  for (int l = 0; l < L; ++l)
    if (layers[l].type == LayerType::kFC) schemes[layers[l].name] = schemeName(node->schemeFor(l));
  uint64_t tx = readCounter(iface, "tx_bytes") - tx0, rx = readCounter(iface, "rx_bytes") - rx0;
  bench::ChargedSeconds charged = charger.charged();
  const double cpu = cpuSeconds() - cpu0;
  auto delta = [](TrafficTotals a, TrafficTotals b) {
    return nlohmann::json{{"sent", a.bytesSent - b.bytesSent}, {"received", a.bytesReceived - b.bytesReceived}};
  };
  nlohmann::json result{{"rank", env.rank},
                        {"system", systemName},
                        {"wire", wirePrecisionName(wirePrecision)},
                        {"model", model},
                        {"batch", em.batch},
                        {"iteration_seconds", times},
                        {"warmup", warmup},
                        {"tx_bytes", tx},
                        {"rx_bytes", rx},
                        {"cpu_seconds", cpu},  // over the measured iterations
                        {"tcp_retransmits", tcpRetransmits() - retrans0},
                        {"device", device},
                        {"fc_schemes", schemes},
                        // full-width seconds of the runtime's own work over the measured iterations
                        {"charged_seconds",
                         {{"gemm", charged.gemm - chargedStart.gemm},
                          {"sum", charged.sum - chargedStart.sum},
                          {"crypto", charged.crypto - chargedStart.crypto}}},
                        {"payload", {{"ps", delta(node->counters().total(TrafficKind::kPS), psStart)},
                                     {"sfb", delta(node->counters().total(TrafficKind::kSFB), sfbStart)},
                                     {"adam", delta(node->counters().total(TrafficKind::kAdam), adamStart)}}}};
  // The last tail, unmeasured (its bytes and CPU are not counted either, as the warm-up's tail is
  // partly counted at the start: a steady state's share).
  if (overlapForward) node->waitIteration();
  node->finish();
  if (tracer) tracer->writeFile(tracePath);
  std::ofstream f(out);
  f << result.dump();
  if (!f) throw IoError("cannot write " + out);
  return 0;
}

}  // namespace poseidon::cli
