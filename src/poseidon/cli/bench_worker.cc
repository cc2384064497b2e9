// poseidon bench-worker: one rank of the emulated-cluster benchmark on the
// Poseidon side. Forward and backward are waits of the emulated model's
// per-layer times (absolute deadlines, so sync work on other threads never
// stretches the emulated GPU, except a reconstruction charged on that GPU:
// bench/device.h's timeline); gradients and factors have the real scaled
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
#include <utility>

#include "poseidon/bench/device.h"
#include "poseidon/bench/emulation.h"
#include "poseidon/bench/systems.h"
#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/client/node.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/common/trace.h"
#include "poseidon/core/kv_layout.h"
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

// One counter of this network namespace's TCP statistics (/proc/net/snmp and /proc/net/netstat are per
// namespace): the file holds pairs of lines, "Prefix: names..." then "Prefix: values...". 0 if absent.
uint64_t procNetCounter(const char* path, const std::string& prefix, const std::string& counter) {
  std::ifstream f(path);
  std::string header, values, line;
  while (std::getline(f, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    if (header.empty()) header = line;
    else values = line;
  }
  std::istringstream h(header), v(values);
  std::string name, value;
  while (h >> name && v >> value)
    if (name == counter) return std::stoull(value);
  return 0;
}

// Segments retransmitted so far: the sign of drops in the shaped links' queues (incast).
uint64_t tcpRetransmits() { return procNetCounter("/proc/net/snmp", "Tcp:", "RetransSegs"); }

// Retransmission timeouts that fired so far: each stalls its connection for at least TCP's minimum
// RTO (200 ms on a stock host), where a fast retransmit or a tail-loss probe costs about one round trip.
uint64_t tcpTimeouts() { return procNetCounter("/proc/net/netstat", "TcpExt:", "TCPTimeouts"); }

// Busy and total jiffies of the whole host so far (/proc/stat's cpu line): kernel time included
// (the shaped links' softirqs, the loopback copies), which no process's rusage shows.
std::pair<uint64_t, uint64_t> hostJiffies() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  f >> cpu;
  uint64_t total = 0, idle = 0, v = 0;
  for (int i = 0; i < 8 && f >> v; ++i) {  // user .. steal (guest time is inside user and nice)
    total += v;
    if (i == 3 || i == 4) idle += v;  // idle, iowait
  }
  return {total - idle, total};
}

// This process's timer slack in nanoseconds (bench/ranks.h sets it for every rank); -1 if unreadable.
int64_t timerSlackNs() {
  std::ifstream f("/proc/self/timerslack_ns");
  int64_t ns = -1;
  return f >> ns ? ns : -1;
}

uint64_t readCounter(const std::string& iface, const char* which) {
  if (iface.empty()) return 0;
  std::ifstream f("/sys/class/net/" + iface + "/statistics/" + which);
  uint64_t v = 0;
  f >> v;
  return v;
}

// bench-worker's settings, as the harness passes them.
struct WorkerArgs {
  std::string model = "vgg19", system = "poseidon", out, iface, bind, wireFlag = "fp32";
  double scale = 0.1;
  int iterations = 8, warmup = 3, timeoutMs = 120000;
  int64_t pairBytes = -1;
  std::string compute = "titanx", chargedOn = "none", tracePath, hostQueue = "auto";
  double gemmFlops = 0, sumBytes = 0, cryptoBytes = 0, linkMbit = 0;
  double timeDilation = 1;  // --time-dilation: every emulated duration F times longer
  int rcvbuf = 0, sendWindow = 0, ioThreads = bench::kBenchIoThreads, sumThreads = kDefaultSumThreads;
  int localRanks = 1, urgentLayers = VanOptions::kAutoUrgentLayers,
      peersPerSendWindow = VanOptions::kDefaultPeersPerSendWindow;
  bool overlapForward = false;
  bool deferReconstruction = true;
};

void addWorkerFlags(FlagSet& flags, WorkerArgs& a) {
  flags.addString("model", &a.model, "emulated model", "NAME");
  flags.addString("compute", &a.compute, "the GPU whose compute tables the model runs on (titanx, h200, h200-bf16)",
                  "GPU");
  flags.addDouble("scale", &a.scale, "width scale s", "S", RealRange::leftOpen(0, 1));
  flags.addString("system", &a.system,
                  "poseidon | poseidon-overlap | ps-wfbp | ps-naive | adam | sfb; all but adam optionally with "
                  "-bf16 or -fp16",
                  "SYS");
  flags.addString("wire", &a.wireFlag,
                  "what gradients travel as: fp32 | bf16 | fp16 (default: the system's suffix, "
                  "else fp32)",
                  "P");
  flags.addInt("iterations", &a.iterations, "measured iterations", "N", IntRange::atLeast(1));
  flags.addInt("warmup", &a.warmup, "unmeasured iterations first", "N", IntRange::atLeast(0));
  flags.addString("out", &a.out, "result JSON file", "FILE");
  flags.addString("iface", &a.iface, "network interface whose byte counters to read", "DEV");
  flags.addString("bind", &a.bind, "data endpoint address", "ADDR");
  flags.addInt("timeout", &a.timeoutMs, "timeout of every wait (ms)", "MS", IntRange::atLeast(1));
  flags.addInt64("pair-bytes", &a.pairBytes, "KV pair size (default: 2 MB x s'^2 at the model's width s')", "BYTES",
                 IntRange::closed(kMinPairBytes, kMaxPairBytes));
  // The device model (bench/device.h): the harness measures the rates once and passes them on.
  flags.addString("charged-on", &a.chargedOn,
                  "name of the node its own work is charged on (for the result; a GPU name puts the GEMM on the "
                  "emulated GPU's timeline)",
                  "NAME");
  flags.addDouble("gemm-flops", &a.gemmFlops, "charge the reconstruction GEMM at full width at this FLOP/s (0: not)",
                  "R", RealRange::atLeast(0));
  flags.addDouble("sum-bytes", &a.sumBytes, "charge the servers' sums at full width at this byte/s (0: not)", "R",
                  RealRange::atLeast(0));
  flags.addDouble("crypto-bytes", &a.cryptoBytes, "charge CURVE encryption at full width at this byte/s (0: not)", "R",
                  RealRange::atLeast(0));
  flags.addString("trace", &a.tracePath, "write a Chrome trace of this rank (compute, sends, receives) to FILE",
                  "FILE");
  flags.addInt("tcp-rcvbuf", &a.rcvbuf,
               "TCP receive buffer per connection into this rank (0: automatic, -1: the OS default)", "BYTES",
               IntRange::closed(-1, 1 << 30));
  flags.addInt("io-threads", &a.ioThreads, "ZeroMQ I/O threads (encryption is charged on them)", "N",
               IntRange::closed(1, 64));
  flags.addInt("sum-threads", &a.sumThreads, "threads summing the shard's pushes (0: the receive loop)", "N",
               IntRange::closed(0, 64));
  flags.addInt("send-window", &a.sendWindow,
               "priority scheduling of the links with this kernel send window per connection (0: FIFO)", "BYTES",
               IntRange::closed(0, 1 << 30));
  flags.addInt("peers-per-send-window", &a.peersPerSendWindow,
               "each connection's kernel send buffer is a window for every N peers, at least one (0: one window each)",
               "N", IntRange::closed(0, 1 << 20));
  flags.addInt("urgent-layers", &a.urgentLayers,
               "send the first K layers' round data on a second connection per peer, marked IP TOS low-delay "
               "(needs a send window; 0: one connection; -1: the runtime's rule, VanOptions::urgentLayers)",
               "K", IntRange::closed(-1, 1 << 20));
  flags.addString("host-queue", &a.hostQueue,
                  "for the automatic --urgent-layers: what the node's egress queue does with the mark (auto: read "
                  "from the kernel; the bench says tos for its two-band queues, which the probe cannot read)",
                  "auto|fifo|tos");
  flags.addBool("defer-reconstruction", &a.deferReconstruction,
                "on a GPU node (--charged-on a GPU), hold each iteration's SFB reconstructions until its backward is "
                "handed over (default true)");
  flags.addBool("overlap-forward", &a.overlapForward,
                "run each layer's next forward as soon as its sync is in, not after the whole barrier");
  flags.addInt("local-ranks", &a.localRanks,
               "ranks on this rank's node, aggregated on its first before they leave it (train --local-ranks)", "L",
               IntRange::closed(1, 4096));
  flags.addDouble("time-dilation", &a.timeDilation,
                  "run the emulated compute and the charged work F times slower, as the harness runs the links "
                  "(bench --time-dilation); times are reported divided by F",
                  "F", RealRange::closed(1, bench::kMaxTimeDilation));
  flags.addDouble("link-mbit", &a.linkMbit,
                  "the link rate, for BestScheme to weigh the GEMM against the bytes (0: bytes alone decide)", "MBIT",
                  RealRange::atLeast(0));
}

// The device this rank charges its own work on (bench/device.h), at full width.
DeviceModel workerDevice(const WorkerArgs& a, const bench::EmulatedModel& em) {
  DeviceModel dm;
  dm.name = a.chargedOn;
  dm.gemmOnGpu = bench::isComputeName(a.chargedOn);
  // The model runs at width em.scale, where its batch is whole (bench::wholeBatchScale): the GEMM
  // back to full width by the batch actually used and the widths, the bytes by the widths.
  dm.flopScale = static_cast<double>(em.fullBatch) / static_cast<double>(em.batch) / (em.scale * em.scale);
  dm.byteScale = 1.0 / (em.scale * em.scale);
  // Under --time-dilation F every rate is F times lower, so that the charged work takes F times
  // longer, as the emulated compute and the links do (BestScheme's comparison is unchanged).
  dm.gemmFlops = a.gemmFlops / a.timeDilation;
  dm.sumBytes = a.sumBytes / a.timeDilation;
  dm.cryptoBytes = a.cryptoBytes / a.timeDilation;
  // The emulated link (--link-mbit: what this model's links run at) is the full-width one slowed by
  // s'^2: BestScheme compares full-width bytes.
  dm.linkBytes = a.linkMbit * 1e6 / 8 * dm.byteScale / a.timeDilation;
  dm.cryptoLanes = a.ioThreads;
  return dm;
}

// This rank's node: the launcher's rank and rendezvous, the emulated model's batch and pairs, the
// harness's network knobs (the system's policy, wire and the charger are the caller's).
NodeOptions workerNodeOptions(const WorkerArgs& a, const RankEnv& env, const bench::EmulatedModel& em,
                              bool pairBytesSet) {
  NodeOptions o;
  o.rank = env.rank;
  o.worldSize = env.worldSize;
  o.masterAddr = resolveHost(env.masterAddr);
  o.masterPort = env.masterPort;
  o.van.bindHost = a.bind.empty() ? localAddressToward(o.masterAddr) : a.bind;
  o.timeout = std::chrono::milliseconds(a.timeoutMs);
  o.settings.batch = em.batch;
  // The paper's 2 MB pairs at full width; the same number of pairs per layer at scale s.
  o.settings.pairBytes = pairBytesSet ? a.pairBytes : scaledPairBytes(kDefaultPairBytes, em.scale);
  o.secret = jobSecretFromEnvironment();
  o.van.receiveBufferBytes = a.rcvbuf;
  o.ioThreads = a.ioThreads;
  o.sumThreads = a.sumThreads;
  o.van.sendWindowBytes = a.sendWindow;
  o.van.peersPerSendWindow = a.peersPerSendWindow;
  o.van.urgentLayers = a.urgentLayers;
  o.van.egressQueue = parseEgressQueue(a.hostQueue);
  o.settings.localRanks = a.localRanks;
  return o;
}

// What the counters said when the measured iterations began (or ended).
struct Counters {
  uint64_t tx = 0, rx = 0, retransmits = 0, timeouts = 0;
  TrafficTotals ps, sfb, adam;
  bench::ChargedSeconds charged;
  double cpu = 0;
  std::pair<uint64_t, uint64_t> host;  // busy, total jiffies
  static Counters read(const std::string& iface, Node& node, const bench::ChargedDevice& charger) {
    Counters c;
    c.tx = readCounter(iface, "tx_bytes");
    c.rx = readCounter(iface, "rx_bytes");
    c.ps = node.counters().total(TrafficKind::kPS);
    c.sfb = node.counters().total(TrafficKind::kSFB);
    c.adam = node.counters().total(TrafficKind::kAdam);
    c.charged = charger.charged();
    c.cpu = cpuSeconds();
    c.host = hostJiffies();
    c.retransmits = tcpRetransmits();
    c.timeouts = tcpTimeouts();
    return c;
  }
};

// One rank's emulated model: random gradients and factors of the real scaled shapes, submitted
// layer by layer as the emulated backward reaches them.
class EmulatedRank {
 public:
  EmulatedRank(const bench::EmulatedModel& em, Node& node, bench::ChargedDevice& gpu, int rank)
      : em_(em), node_(node), gpu_(gpu), L_(em.desc.layers.size()) {
    std::mt19937 rng(static_cast<unsigned>(rank + 1));
    std::uniform_real_distribution<float> dist(-1e-3f, 1e-3f);
    const auto& layers = em.desc.layers;
    grads_.resize(L_), us_.resize(L_), vs_.resize(L_), outs_.resize(L_);
    for (size_t l = 0; l < L_; ++l) {
      grads_[l].resize(static_cast<size_t>(layers[l].numel()));
      for (auto& x : grads_[l]) x = dist(rng);
      if (layers[l].type == LayerType::kFC) {
        us_[l].resize(static_cast<size_t>(em.batch * layers[l].m));
        vs_[l].resize(static_cast<size_t>(em.batch * layers[l].n));
        for (auto& x : us_[l]) x = dist(rng);
        for (auto& x : vs_[l]) x = dist(rng);
        outs_[l].resize(grads_[l].size());
      }
    }
  }

  void submit(int l) {
    if (em_.desc.layers[l].type == LayerType::kFC && node_.schemeFor(l) != Scheme::kPS) {
      node_.submitFactors(l, us_[l].data(), vs_[l].data(), em_.batch,
                          LayerBuffer::contiguous(outs_[l].data(), static_cast<int64_t>(outs_[l].size())));
    } else {
      node_.submitDense(l, LayerBuffer::contiguous(grads_[l].data(), static_cast<int64_t>(grads_[l].size())));
    }
  }

  // One iteration, from the start of its forward pass to the end of its backward and, with the
  // barrier, its sync; returns its seconds. With `overlapForward` its forward waits layer by layer
  // for the previous iteration's sync (so it carries that iteration's tail, as every iteration in a
  // steady state does). `overlap`: WFBP (each layer submitted as its backward ends).
  double iteration(int it, bool overlap, bool overlapForward, Tracer* tracer) {
    using Clock = std::chrono::steady_clock;
    auto toDuration = [](double s) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    const int L = static_cast<int>(L_);
    auto t0 = Clock::now();
    const int64_t forwardUs = Tracer::nowMicros();
    auto deadline = t0;
    if (overlapForward && it > 0) {
      for (int l = 0; l < L; ++l) {
        // Layer l's update of iteration it - 1. Only a real wait moves the emulated GPU's clock (an
        // oversleep of the previous layer must not add up over a few hundred layers).
        if (!node_.layerReady(l)) {
          const int64_t waitFromUs = tracer ? Tracer::nowMicros() : 0;  // the emulated GPU idles until it lands
          node_.waitLayer(l);
          deadline = std::max(deadline, Clock::now());
          if (tracer) {
            tracer->span("forward waits for " + em_.desc.layers[static_cast<size_t>(l)].name, "wait", 0, waitFromUs,
                         Tracer::nowMicros(), it);
          }
        }
        deadline = gpu_.compute(deadline, toDuration(em_.forwardSeconds[l]));
        std::this_thread::sleep_until(deadline);
      }
    } else {
      double forwardTotal = 0;
      for (double f : em_.forwardSeconds) forwardTotal += f;
      deadline = gpu_.compute(deadline, toDuration(forwardTotal));
      std::this_thread::sleep_until(deadline);
    }
    node_.beginIteration(it);
    const int64_t backwardUs = Tracer::nowMicros();
    if (tracer) {
      tracer->span(overlapForward && it > 0 ? "forward (emulated, layer by layer as the sync lands)"
                                            : "forward (emulated)",
                   "compute", 0, forwardUs, backwardUs, it);
    }
    for (int l = L - 1; l >= 0; --l) {
      deadline = gpu_.compute(deadline, toDuration(em_.backwardSeconds[l]));
      std::this_thread::sleep_until(deadline);
      if (overlap) submit(l);
    }
    const int64_t waitUs = Tracer::nowMicros();
    if (tracer) tracer->span("backward (emulated)", "compute", 0, backwardUs, waitUs, it);
    if (!overlap)
      for (int l = L - 1; l >= 0; --l) submit(l);
    if (!overlapForward) {
      node_.waitIteration();
      if (tracer) tracer->span("wait for the sync", "wait", 0, waitUs, Tracer::nowMicros(), it);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  const bench::EmulatedModel& em_;
  Node& node_;
  bench::ChargedDevice& gpu_;  // the emulated GPU's timeline (a reconstruction on it delays the layers)
  const size_t L_;
  std::vector<std::vector<float>> grads_, us_, vs_, outs_;
};

// The result file: times, bytes (interface and payload by scheme), CPU, retransmits and the charges
// over the measured iterations (`end` - `start`).
nlohmann::json workerResult(const WorkerArgs& a, const std::string& systemName, WirePrecision wire,
                            const bench::EmulatedModel& em, Node& node, int rank, const std::vector<double>& times,
                            const Counters& start, const Counters& end) {
  nlohmann::json schemes = nlohmann::json::object();
  for (size_t l = 0; l < em.desc.layers.size(); ++l) {
    const auto& layer = em.desc.layers[l];
    if (layer.type == LayerType::kFC) schemes[layer.name] = schemeName(node.schemeFor(static_cast<int>(l)));
  }
  auto delta = [](TrafficTotals x, TrafficTotals y) {
    return nlohmann::json{{"sent", x.bytesSent - y.bytesSent}, {"received", x.bytesReceived - y.bytesReceived}};
  };
  return {
      {"rank", rank},
      {"system", systemName},
      {"wire", wirePrecisionName(wire)},
      {"model", a.model},
      {"batch", em.batch},
      {"iteration_seconds", times},
      {"warmup", a.warmup},
      {"tx_bytes", end.tx - start.tx},
      {"rx_bytes", end.rx - start.rx},
      {"cpu_seconds", end.cpu - start.cpu},  // over the measured iterations
      {"host_busy_jiffies", end.host.first - start.host.first},
      {"host_total_jiffies", end.host.second - start.host.second},
      {"tcp_retransmits", end.retransmits - start.retransmits},
      {"tcp_timeouts", end.timeouts - start.timeouts},
      {"timer_slack_ns", timerSlackNs()},
      {"device", a.chargedOn},
      {"compute", a.compute},
      {"fc_schemes", schemes},
      // full-width seconds of the runtime's own work over the measured iterations
      {"charged_seconds",
       {{"gemm", end.charged.gemm - start.charged.gemm},
        {"sum", end.charged.sum - start.charged.sum},
        {"crypto", end.charged.crypto - start.charged.crypto}}},
      {"payload",
       {{"ps", delta(end.ps, start.ps)}, {"sfb", delta(end.sfb, start.sfb)}, {"adam", delta(end.adam, start.adam)}}}};
}

}  // namespace

int benchWorkerCommand(const std::vector<std::string>& args) {
  WorkerArgs a;
  FlagSet flags("bench-worker", "poseidon bench-worker --model NAME --system SYS --out FILE [flags]",
                "One rank of 'poseidon bench' (started by it; not meant to be run by hand).");
  addWorkerFlags(flags, a);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  if (a.out.empty()) throw InvalidArgument("--out is required");
  if ((a.overlapForward || a.system.rfind("poseidon-overlap", 0) == 0) && a.warmup < 1) {
    throw InvalidArgument("--overlap-forward needs --warmup 1 or more (each iteration carries the one before's tail)");
  }
  bench::EmulatedModel em = bench::emulatedModel(a.model, a.scale, a.compute);
  bench::dilate(em, a.timeDilation);
  // This rank's node charges its own work on it (common/work_charger.h).
  bench::ChargedDevice charger(workerDevice(a, em));
  // A wire suffix (poseidon-bf16) picks the wire; the rest picks the scheme and the overlap.
  const bench::SystemChoice parsed = bench::parseBenchSystem(a.system);  // bench/systems.h
  if (parsed.spec->ddp) {
    throw InvalidArgument("unknown system '" + a.system +
                          "' (bench-worker runs Poseidon's; DDP's run in ddp_worker.py)");
  }
  if (flags.wasSet("wire") && parsed.wire != WirePrecision::kFp32) {
    throw InvalidArgument("--wire and a system with a wire suffix ('" + a.system + "') cannot be combined");
  }
  const WirePrecision wirePrecision = flags.wasSet("wire") ? parseWirePrecision(a.wireFlag) : parsed.wire;
  const bool overlap = parsed.spec->wfbp;
  RankEnv env = rankFromEnvironment();
  if (parsed.spec->overlapForward) {
    // docs/scheduling.md: priority-scheduled links, each layer's next forward as soon as its sync
    // lands. The window: the runtime's default for this many peers and queue (Van::defaultSendWindow;
    // 1 MB at full width, half a KV pair; 256 KB past 8 peers on two-band nodes), scaled by s^2 like
    // the pairs, at least the runtime's smallest.
    a.overlapForward = true;
    if (!flags.wasSet("send-window")) {
      a.sendWindow =
          benchDefaultSendWindow(env.worldSize, parseEgressQueue(a.hostQueue) == EgressQueue::kTos, em.scale);
    }
  }

  setLogPrefix("rank " + std::to_string(env.rank));  // like every rank's: the harness drops it from its report
  NodeOptions o = workerNodeOptions(a, env, em, flags.wasSet("pair-bytes"));
  o.settings.policy = parsed.spec->policy;
  o.settings.wire = wirePrecision;
  o.security = parsed.noCurve ? TransportSecurity::kNone : TransportSecurity::kCurve;
  o.charger = &charger;
  // As a CUDA model does (torch/distributed.cc): a GEMM on the GPU's timeline waits for the backward.
  o.deferReconstruction = a.deferReconstruction && charger.model().gemmOnGpu;
  std::unique_ptr<Tracer> tracer;
  if (!a.tracePath.empty()) tracer = std::make_unique<Tracer>(env.rank);
  o.tracer = tracer.get();
  auto node = Node::start(o, em.desc);

  EmulatedRank rank(em, *node, charger, env.rank);
  std::vector<double> times;
  Counters start;
  for (int it = 0; it < a.warmup + a.iterations; ++it) {
    // With --overlap-forward, the warm-up's tail is in flight: counted, as a steady state's.
    if (it == a.warmup) start = Counters::read(a.iface, *node, charger);
    times.push_back(rank.iteration(it, overlap, a.overlapForward, tracer.get()));
  }
  Counters end = Counters::read(a.iface, *node, charger);
  // --time-dilation: the times and charges as the undilated cluster would have them (CPU seconds and
  // the host's jiffies stay real: they say whether this host kept up).
  for (double& t : times) t /= a.timeDilation;
  for (bench::ChargedSeconds* c : {&start.charged, &end.charged}) {
    c->gemm /= a.timeDilation, c->sum /= a.timeDilation, c->crypto /= a.timeDilation;
  }
  nlohmann::json result = workerResult(a, a.system, wirePrecision, em, *node, env.rank, times, start, end);
  // The last tail, unmeasured (its bytes and CPU are not counted either, as the warm-up's tail is
  // partly counted at the start: a steady state's share).
  if (a.overlapForward) node->waitIteration();
  node->finish();
  if (tracer) tracer->writeFile(a.tracePath);
  std::ofstream f(a.out);
  f << result.dump();
  if (!f) throw IoError("cannot write " + a.out);
  return 0;
}

}  // namespace poseidon::cli
