// poseidon tune's backend on the time-to-accuracy harness: every probe and epoch a real `poseidon
// train` per node on the emulated cluster (cli/accuracy_harness.h), resumed from and saved to a
// checkpoint; the HE model from the planner, as `poseidon plan --check` models such a run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/tuner.h"
#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"
#include "poseidon/planner/planner.h"

namespace poseidon::cli {
namespace fs = std::filesystem;
namespace {

// Every run a real `poseidon train` per node on the harness's emulated cluster, from and to a
// checkpoint directory under the harness's work directory.
class HarnessBackend : public TuneBackend {
 public:
  HarnessBackend(AccuracyHarness* h, const TuneConfig& cfg, double mbit) : h_(h), cfg_(cfg), mbit_(mbit) {}

  // As `poseidon plan --check` models a time-to-accuracy run on the emulated cluster.
  TuneHe predict(int groups, double fcSecondsPerSample) override {
    planner::Workload w = planner::paddedWorkload(resolveModel("lenet"), h_->batch, h_->padMs / 1e3);
    planner::MergedFc fc;
    if (cfg_.mergedFc) {
      std::tie(w, fc) = planner::paddedMergedFc(resolveModel("lenet"), h_->batch, h_->padMs / 1e3, fcSecondsPerSample);
    }
    planner::Cluster c = planner::emulatedCluster(planner::Cluster{}, h_->nodes, mbit_,
                                                  static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    c.pairBytes = h_->pairBytes;
    const planner::GroupPrediction p = planner::predictGroups(w, c, groups, cfg_.mergedFc ? &fc : nullptr);
    return {p.stepSeconds, 1 / p.samplesPerSecond, p.fcServerBusy};
  }

  std::string heSource() const override { return "planner"; }

  TuneRunResult train(const TuneRunSpec& spec) override {
    TuneRunResult out;
    out.state = strCat(h_->work, "/state-", mbit_, "-", ++runs_);
    fs::create_directories(out.state);
    if (!spec.from.empty()) {
      // Resume from `from`'s checkpoint at fromStep (poseidon train's step-NNNNNNNNN): a copy, so that
      // other probes start from it too.
      char name[32];
      std::snprintf(name, sizeof name, "step-%09d", spec.fromStep);
      const fs::path src = fs::path(spec.from) / name;
      if (!fs::exists(src / "meta.json")) throw Error(strCat("no complete checkpoint ", src.string()));
      fs::copy(src, fs::path(out.state) / name, fs::copy_options::recursive);
    }
    AccuracySystem sys;
    sys.name = strCat("g", spec.groups, cfg_.mergedFc ? "fc" : "");
    sys.groups = spec.groups;
    sys.mergedFc = cfg_.mergedFc;
    sys.lr = spec.lr;
    sys.momentum = spec.momentum;
    RunExtras extra;
    extra.tag = strCat("run", runs_);
    extra.maxSteps = spec.toStep;
    extra.startStep = spec.fromStep;
    // Every run starts and ends on a multiple of the probe length: a probe's last curve point is its end
    // model (with --probe-samples 0: its train_loss is the mean over the probe's second half, over the
    // last probe length for an epoch), and its one checkpoint is at its end (toStep is the only multiple
    // of itself in (fromStep, toStep]). With --probe-samples, a probe is scored at the points of its
    // second half (the tuner's spread): every d steps, the largest divisor d of the probe that leaves
    // at least three of them there (the default probe of 10: steps 6, 8, 10).
    const int p = cfg_.probeSteps;
    const bool isEpoch = spec.kind == "epoch";
    int spreadEvery = 0;
    for (int d = p; d >= 1 && cfg_.probeSamples > 0; --d)
      if (p % d == 0 && p / d - p / (2 * d) >= 3) {
        spreadEvery = d;
        break;
      }
    extra.curveEvery = isEpoch ? p : spreadEvery > 0 ? spreadEvery : p % 2 != 0 ? p : p / 2;
    extra.quiet = true;
    // A run whose model goes non-finite skips the rest (the cold start's "early stop on divergence"):
    // only the steps up to there are on the clock.
    extra.trainArgs = {"--checkpoint", out.state,           "--checkpoint-every", std::to_string(spec.toStep),
                       "--regroup",    "--allow-divergence"};
    if (cfg_.probeSamples > 0) {
      extra.trainArgs.insert(extra.trainArgs.end(), {"--curve-loss-samples", std::to_string(cfg_.probeSamples)});
    }
    AccuracyRun r = h_->run(sys, extra);
    if (!r.ok) {
      throw Error(
          strCat(spec.kind, " g=", spec.groups, " lr=", spec.lr, " momentum=", spec.momentum, " failed: ", r.error));
    }
    out.clock = r.summary.value("train_clock_seconds", 0.0);
    const double fcUpdates = r.summary.value("fc_server_updates", 0.0);
    if (fcUpdates > 0) {  // a group round is k members' batches
      out.fcBusySeconds = r.summary.value("fc_server_busy_seconds", 0.0);
      out.fcSamples = fcUpdates * static_cast<double>(h_->nodes / spec.groups) * static_cast<double>(h_->batch);
    }
    out.curve = r.summary["curve"];
    const auto& diverged = r.summary["diverged_at_step"];
    if (diverged.is_number()) out.divergedAt = diverged.get<int>();
    // An epoch is scored by its end model only; a probe by its points past its middle.
    const char* key = cfg_.probeSamples > 0 ? "sample_loss" : "train_loss";
    const double middle = isEpoch ? spec.toStep - 0.5 : (spec.fromStep + spec.toStep) / 2.0;
    for (const auto& q : out.curve) {
      const double step = q["step"].get<double>();
      if (step > middle) out.points.emplace_back(step, curveNumber(q, key));
    }
    if (out.points.empty() && !out.curve.empty()) {
      out.points.emplace_back(out.curve.back()["step"].get<double>(), curveNumber(out.curve.back(), key));
    }
    return out;
  }

 private:
  AccuracyHarness* h_;
  TuneConfig cfg_;
  double mbit_;
  int runs_ = 0;
};

}  // namespace

nlohmann::json tune(AccuracyHarness* harness, const TuneConfig& cfg, double mbit) {
  HarnessBackend backend(harness, cfg, mbit);
  TuneConfig c = cfg;
  c.targetAccuracy = harness->targetAccuracy;
  c.targetLoss = harness->targetLoss;
  c.lossKey = "train_loss";
  const auto wall0 = std::chrono::steady_clock::now();
  nlohmann::json r = tune(&backend, c);
  r["mbit"] = mbit;
  r["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r;
}

}  // namespace poseidon::cli
