#include "poseidon/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <queue>

#include "poseidon/bench/emulation.h"
#include "poseidon/bench/systems.h"
#include "poseidon/common/device_model.h"
#include "poseidon/common/error.h"
#include "poseidon/core/best_scheme.h"
#include "poseidon/planner/sim.h"
#include "poseidon/transport/van.h"

namespace poseidon::planner {
namespace {

using namespace detail;  // the event loop and the network model (sim.h)

// The systems the planner models, by their names in the bench (bench/systems.h).
const std::vector<std::pair<System, const char*>>& systemNames() {
  static const std::vector<std::pair<System, const char*>> names = [] {
    std::vector<std::pair<System, const char*>> v;
    for (const bench::SystemSpec& s : bench::systemRegistry())
      if (s.planned) v.emplace_back(*s.planned, s.name);
    return v;
  }();
  return names;
}

// DDP: buckets in backward order, each ring-allreduced once its last gradient is ready, one at a time.
Prediction predictDdp(const Workload& w, const Cluster& c, double elementBytes) {
  const int P = c.workers;
  const double s2 = c.scale * c.scale;
  const size_t L = w.model.layers.size();
  double forward = 0;
  for (double f : w.forwardSeconds) forward += f;
  std::vector<double> backwardEnd(L);
  double t = forward;
  for (size_t l = L; l-- > 0;) backwardEnd[l] = (t += w.backwardSeconds[l]);
  // torch's bucketing: parameters in reverse order; a bucket closes once it reaches its cap.
  struct Bucket {
    double bytes = 0, ready = 0;
  };
  std::vector<Bucket> buckets(1);
  for (size_t l = L; l-- > 0;) {
    const auto& params = w.model.layers[l].params;
    for (size_t k = params.size(); k-- > 0;) {
      const double cap = (buckets.size() == 1 ? c.ddpFirstBucketBytes : c.ddpBucketBytes) * s2;
      if (buckets.back().bytes >= cap) buckets.emplace_back();
      // Buckets fill by fp32 gradient bytes; the fp16 hook then sends half of them.
      buckets.back().bytes += static_cast<double>(params[k].numel()) * sizeof(float);
      buckets.back().ready = backwardEnd[l];
    }
  }
  Prediction p;
  double end = t, tx = 0;
  if (P > 1) {
    double free = 0;
    for (const auto& b : buckets) {
      const double wire = b.bytes * elementBytes / sizeof(float);
      const double onLink = 2.0 * (P - 1) / P * wire * c.linkOverhead + 2.0 * (P - 1) * c.messageBytes;
      const double start = std::max(b.ready, free);
      free = start + onLink / c.linkBytes + 2.0 * (P - 1) * c.ddpStepSeconds;
      tx += onLink;
    }
    end = std::max(end, free);
  }
  p.iterationSeconds = end;
  p.maxNodeTxBytes = tx;
  return p;
}

}  // namespace

const char* systemName(System s) {
  for (const auto& [sys, name] : systemNames())
    if (sys == s) return name;
  return "?";
}

double sendWindowFor(const Cluster& c) {
  if (c.sendWindowBytes > 0) return c.sendWindowBytes;
  // The nodes the bench or train tells their queue is two-band (--host-queue tos), as the ranks decide.
  return Van::defaultSendWindow(static_cast<size_t>(std::max(0, c.workers - 1)), c.lowDelayFirst && c.hostQueueTold,
                                c.sendWindowRule);
}

const char* linksName(Cluster::Links links) {
  switch (links) {
    case Cluster::Links::kAsBuilt:
      return "as-built";
    case Cluster::Links::kCredits:
      return "credits";
    case Cluster::Links::kIdeal:
      return "ideal";
  }
  return "?";
}

Cluster::Links parseLinks(const std::string& text) {
  for (auto l : {Cluster::Links::kAsBuilt, Cluster::Links::kCredits, Cluster::Links::kIdeal})
    if (text == linksName(l)) return l;
  throw InvalidArgument("--links must be as-built, credits or ideal, got '" + text + "'");
}

System parseSystem(const std::string& text) {
  std::string known;
  for (const auto& [sys, name] : systemNames()) {
    if (text == name) return sys;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw InvalidArgument("unknown system '" + text + "' (the planner models " + known + ")");
}

const std::vector<System>& allSystems() {
  static const std::vector<System> all = [] {
    std::vector<System> v;
    for (const auto& [sys, name] : systemNames()) v.push_back(sys);
    return v;
  }();
  return all;
}

double Workload::computeSeconds() const {
  double t = 0;
  for (size_t i = 0; i < forwardSeconds.size(); ++i) t += forwardSeconds[i] + backwardSeconds[i];
  return t;
}

Workload zooWorkload(const std::string& name, double requestedScale, const std::string& compute, bool wholeBatch) {
  bench::EmulatedModel m = bench::emulatedModel(name, requestedScale, compute, wholeBatch);
  const double scale = m.scale;
  Workload w;
  w.model = std::move(m.desc);
  w.batch = m.batch;
  w.forwardSeconds = std::move(m.forwardSeconds);
  w.backwardSeconds = std::move(m.backwardSeconds);
  w.flopScale = static_cast<double>(m.fullBatch) / static_cast<double>(m.batch) / (scale * scale);
  return w;
}

Workload workloadFor(ModelDesc model, int64_t batch, double iterationSeconds) {
  if (model.layers.empty()) throw InvalidArgument("model '" + model.name + "' has no layers");
  if (batch < 1) throw InvalidArgument("the batch must be at least 1");
  if (!(iterationSeconds > 0)) throw InvalidArgument("the single-worker iteration time must be > 0");
  double total = 0;
  for (const auto& l : model.layers) total += static_cast<double>(l.macsPerSample);
  Workload w;
  for (const auto& l : model.layers) {
    const double share = total > 0 ? static_cast<double>(l.macsPerSample) / total : 1.0 / model.layers.size();
    w.forwardSeconds.push_back(iterationSeconds * share / 3.0);
    w.backwardSeconds.push_back(iterationSeconds * share * 2.0 / 3.0);
  }
  w.model = std::move(model);
  w.batch = batch;
  return w;
}

Workload paddedWorkload(ModelDesc model, int64_t batch, double seconds) {
  Workload w = workloadFor(std::move(model), batch, seconds);
  for (size_t l = 0; l < w.forwardSeconds.size(); ++l) {
    w.forwardSeconds[l] += w.backwardSeconds[l];
    w.backwardSeconds[l] = 0;
  }
  return w;
}

// What every model needs of its inputs (InvalidArgument otherwise).
Cluster emulatedCluster(const Cluster& calibration, int workers, double mbit, int hostCores) {
  Cluster c = calibration;
  c.workers = workers;
  c.linkBytes = mbit * 1e6 / 8 * kEmulatedLinkEfficiency;
  c.messageSeconds = calibration.messageSeconds * std::max(1.0, static_cast<double>(workers) / std::max(1, hostCores));
  return c;
}

static void checkInputs(const Workload& workload, const Cluster& cluster) {
  if (cluster.workers < 1) throw InvalidArgument("the planner needs at least one worker");
  if (cluster.localRanks < 1) throw InvalidArgument("the planner needs at least one rank per node");
  if (cluster.servers < 0 || cluster.servers > cluster.workers) {
    throw InvalidArgument(strCat("the planner's ", cluster.servers, " server shards exceed its ", cluster.workers,
                                 " nodes (the shards live on nodes 0..servers-1)"));
  }
  if (workload.forwardSeconds.size() != workload.model.layers.size() ||
      workload.backwardSeconds.size() != workload.model.layers.size()) {
    throw InvalidArgument("the workload's compute times do not match its layers");
  }
  if (cluster.workers > 1 && !(cluster.linkBytes > 0)) throw InvalidArgument("the planner needs a link rate > 0");
  if (!(cluster.scale > 0 && cluster.scale <= 1)) throw InvalidArgument("the width scale must be in (0, 1]");
}

Prediction predict(const Workload& workload, const Cluster& cluster, System system) {
  checkInputs(workload, cluster);
  Prediction p;
  const int ranks = cluster.workers * cluster.localRanks;
  const bool ddp = system == System::kDdp || system == System::kDdpFp16;
  if (ddp && (cluster.workers > 1 || cluster.localRanks == 1)) {
    Cluster ring = cluster;  // every rank in the ring; each node's link carries one hop of it
    ring.workers = ranks;
    p = predictDdp(workload, ring, system == System::kDdpFp16 ? 2.0 : 4.0);
  } else if (ranks == 1 || ddp) {
    // One rank, or DDP's ranks on one node: nothing crosses a link (its hops inside the node are free).
    p.iterationSeconds = workload.computeSeconds();
  } else {
    p = runPoseidonModel(workload, cluster, system);
  }
  p.system = system;
  p.workers = cluster.workers;
  p.computeSeconds = workload.computeSeconds();
  p.iterationSeconds = std::max(p.iterationSeconds, p.computeSeconds);
  p.speedup = ranks * p.computeSeconds / p.iterationSeconds;
  p.efficiency = p.speedup / ranks;
  p.boundSeconds = std::max(p.computeSeconds, cluster.workers > 1 ? p.maxNodeTxBytes / cluster.linkBytes : 0.0);
  return p;
}

std::pair<Workload, MergedFc> splitMergedFc(const Workload& w) {
  const size_t L = w.model.layers.size();
  size_t first = L;
  while (first > 0 && w.model.layers[first - 1].type == LayerType::kFC) --first;
  if (first == L) throw InvalidArgument(strCat("model ", w.model.name, " has no FC layers at its top to merge"));
  if (first == 0) throw InvalidArgument(strCat("model ", w.model.name, " is all FC: nothing is left on the workers"));
  Workload rest = w;
  rest.model.layers.resize(first);
  rest.forwardSeconds.resize(first);
  rest.backwardSeconds.resize(first);
  MergedFc fc;
  fc.activationFloats = static_cast<double>(w.model.layers[first].n);  // weight m x n: n is the input width
  double seconds = 0;
  for (size_t l = first; l < L; ++l) seconds += w.forwardSeconds[l] + w.backwardSeconds[l];
  fc.serverSecondsPerSample = seconds / static_cast<double>(std::max<int64_t>(1, w.batch));
  return {std::move(rest), fc};
}

std::pair<Workload, MergedFc> paddedMergedFc(const ModelDesc& model, int64_t batch, double seconds,
                                             double serverSecondsPerSample) {
  auto [workers, fc] = splitMergedFc(workloadFor(model, batch, 1.0));
  fc.serverSecondsPerSample = serverSecondsPerSample;
  return {paddedWorkload(workers.model, batch, seconds), fc};
}

GroupPrediction predictGroups(const Workload& workload, const Cluster& cluster, int groups, const MergedFc* mergedFc) {
  checkInputs(workload, cluster);
  if (groups < 1 || cluster.workers % groups != 0)
    throw InvalidArgument(strCat(groups, " compute groups do not divide ", cluster.workers, " workers"));
  GroupPrediction p;
  if (cluster.workers == 1 && !mergedFc) {
    p.groups = p.groupSize = 1;
    p.stepSeconds = p.updateSeconds = workload.computeSeconds();
    p.samplesPerSecond = static_cast<double>(workload.batch) / p.stepSeconds;
  } else {
    p = runGroupModel(workload, cluster, groups, mergedFc);
  }
  p.computeSeconds = workload.computeSeconds();
  return p;
}

const char* costName(Cost c) {
  switch (c) {
    case Cost::kCrypto:
      return "CURVE encryption";
    case Cost::kCopies:
      return "host copies";
    case Cost::kMessages:
      return "receive loop per message";
    case Cost::kSums:
      return "shard sums";
    case Cost::kGemm:
      return "SFB reconstruction";
  }
  return "?";
}

const std::vector<Cost>& allCosts() {
  static const std::vector<Cost> all{Cost::kCrypto, Cost::kCopies, Cost::kMessages, Cost::kSums, Cost::kGemm};
  return all;
}

namespace {
// The cluster's rate (or time) of `cost`: each cost is one number, and 0 leaves it out.
template <typename C>  // Cluster or const Cluster
auto& costField(C& c, Cost cost) {
  switch (cost) {
    case Cost::kCrypto:
      return c.cryptoBytes;
    case Cost::kCopies:
      return c.copyBytes;
    case Cost::kMessages:
      return c.messageSeconds;
    case Cost::kSums:
      return c.sumBytes;
    case Cost::kGemm:
      return c.gemmFlops;
  }
  throw InvalidArgument("unknown cost");
}
}  // namespace

bool charges(const Cluster& c, Cost cost) { return costField(c, cost) > 0; }

Cluster withoutCost(Cluster c, Cost cost) {
  costField(c, cost) = 0;
  return c;
}

double costBindsFrom(const Workload& workload, Cluster cluster, System system, Cost cost, double margin, double lo,
                     double hi) {
  if (cluster.workers == 1) return kInf;
  if (!charges(cluster, cost)) return kInf;
  const Cluster free = withoutCost(cluster, cost);
  auto binds = [&](double rate) {
    Cluster with = cluster, without = free;
    with.linkBytes = without.linkBytes = rate;
    return predict(workload, with, system).iterationSeconds >=
           (1 + margin) * predict(workload, without, system).iterationSeconds;
  };
  if (!binds(hi)) return kInf;
  if (binds(lo)) return 0;
  while (hi / lo > 1.01) {
    const double mid = std::sqrt(lo * hi);
    (binds(mid) ? hi : lo) = mid;
  }
  return hi;
}

double minLinkBytesFor(const Workload& workload, Cluster cluster, System system, double efficiency) {
  if (cluster.workers == 1) return 0;
  auto reaches = [&](double rate) {
    cluster.linkBytes = rate;
    return predict(workload, cluster, system).efficiency >= efficiency;
  };
  // A system that misses the mark even on this link (too many messages, or its compute alone) is
  // "never" after one prediction.
  constexpr double kFastest = 1e6 * 268435456.0;  // 1e6 x 4^14 bytes/s, ~2 Pbit/s
  // The start: the cluster's own rate, within [1 B/s, kFastest] (an absurd --rate must not make the
  // bracket below walk hundreds of factors of 4, or forever from infinity).
  const double own = cluster.linkBytes;
  const double given = std::isfinite(own) && own > 0 ? std::clamp(own, 1.0, kFastest) : 1e9;
  if (!reaches(kFastest)) return kInf;
  // Bracket the crossing by factors of 4 from the rate asked about (the answer is usually within a
  // few factors of it: 2-3 predictions, where a bracket from 1 MB/s up took 8-10 at 10 Gbit/s).
  double lo, hi;
  if (reaches(given)) {
    hi = given;
    lo = given / 4;
    while (reaches(lo)) {
      if (lo <= 1) return lo;
      hi = lo;
      lo /= 4;
    }
  } else {
    lo = given;
    hi = std::min(given * 4, kFastest);
    while (hi < kFastest && !reaches(hi)) {
      lo = hi;
      hi = std::min(hi * 4, kFastest);
    }
  }
  while (hi / lo > 1.005) {
    const double mid = std::sqrt(lo * hi);
    (reaches(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace poseidon::planner
