// poseidon tune: Omnivore's automatic optimizer (Algorithm 1; appendix E-C and E-D of
// omnivore-2016-arxiv.txt) on the time-to-accuracy mode (docs/omnivore.md): it picks the number of
// compute groups g, the explicit momentum mu and the learning rate eta by short probes of real
// training on the emulated cluster, trains with the winner for an epoch, and repeats.
//
//   cold start   g = 1 (synchronous), mu = 0.9; eta over --lrs from the lowest up, each a probe from
//                the initial model; stop at the first that is worse than the one before or
//                diverges; then train the cold-start epoch with the best.
//   first g      the smallest g whose predicted time per sample (the planner's HE model,
//                planner::predictGroups) is within 5% of the best over --groups-list: where more
//                asynchrony stops buying hardware efficiency (the paper: the smallest g that
//                saturates the FC server; without a merged FC this is its analogue). With --merged-fc,
//                the paper's rule: the smallest g whose predicted FC server load is at least 95% (the
//                largest listed when none is), the server's time per sample measured in the cold start.
//   each epoch   at the current g, probe mu in --momenta up to the last epoch's mu, and eta in
//                {eta*, eta* / 10}, every probe from the epoch's starting model; if mu = 0 has the
//                lowest loss, also probe mu = 0.1 and 0.2 (at its eta); then the lowest loss wins,
//                and configurations within 5% of it are probed further (up to twice, never past
//                the epoch's end); if mu = 0 still wins and g > 1, move to the largest listed g of
//                at most g / 2 and search again. Then train the rest of the epoch from the
//                winner's end state.
//
// A probe is a tenth of an epoch (the paper's ratio is 1 minute per hour; the issue keeps 1:10);
// its loss is where it left the model: the end model's mean loss on --probe-samples fixed training
// images (default 4096, evenly spaced; poseidon train --curve-loss-samples), scored after the run
// and off the training clock: the paper's "lowest final loss". Rank 0's mean training loss over
// the probe's second half (the signal with --probe-samples 0) moved more between windows of the
// same configuration than between configurations (bench/results/tune-100mbit.log). The winner's
// steps are kept (the epoch continues from its state), so what tuning costs is the losers' time.
// Every decision is printed and written to the summary JSON. Time is the training clock: seconds
// in training steps, summed over every run (probes and epochs), as `bench --accuracy` counts it.
//
// Every run skips its remaining steps once its model is found not finite (poseidon train
// --allow-divergence: the paper's early stop on divergence), so a diverged probe or epoch costs
// only the steps up to there.
// Beyond the paper, for a tuner that must not stop half-way: a probe that diverges loses; when
// every probe of a grid diverges, g is lowered as when mu = 0 wins (at g = 1 it is an error); an
// epoch that diverges is run again from the winner's state at a tenth of its learning rate (at
// most twice). The cold start probes g = 1 only (appendix E-D also searches every g there).
#include "poseidon/cli/tuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "poseidon/bench/cluster.h"
#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/common/error.h"
#include "poseidon/launch/env.h"
#include "poseidon/model/zoo.h"
#include "poseidon/planner/planner.h"

namespace poseidon::cli {
namespace fs = std::filesystem;
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTie = 0.05;           // losses within 5% of the best are a tie (the paper's threshold)
constexpr int kMaxExtensions = 2;       // a tie is probed further at most this often
constexpr int kEpochRetries = 2;        // a diverged epoch is run again at lr / 10 at most this often
constexpr double kHeSaturation = 0.05;  // the first g: within 5% of the best predicted time per sample

// One run of the tuner: a probe or the rest of an epoch, from a saved state to a saved state.
struct Stage {
  std::string kind;  // "cold-start probe", "probe", "extension", "epoch"
  int groups = 0;
  double lr = 0, momentum = 0;
  int fromStep = 0, toStep = 0;
  // The run's loss (inf: diverged): its end model's mean loss on --probe-samples fixed training images;
  // with --probe-samples 0, rank 0's mean training loss over the run's second half.
  double loss = kInf;
  double clock = 0;     // training-clock seconds it took
  int divergedAt = -1;  // the step its model was found not finite, where the run stopped (-1: it did not)
  // Merged FC: the FC server's busy seconds and the samples it served in this run (0: none).
  double fcBusySeconds = 0, fcSamples = 0;
  std::string state;  // checkpoint directory holding its end state
  nlohmann::json curve;
  std::vector<size_t> runs;  // the tuner's runs this stage is made of (a probe and its extensions)
  bool won = false;          // part of the trained model's path
  nlohmann::json toJson() const {
    return {{"kind", kind},
            {"groups", groups},
            {"lr", lr},
            {"momentum", momentum},
            {"from_step", fromStep},
            {"to_step", toStep},
            {"loss", std::isinf(loss) ? nlohmann::json("diverged") : nlohmann::json(loss)},
            {"diverged_at_step", divergedAt >= 0 ? nlohmann::json(divergedAt) : nlohmann::json(nullptr)},
            {"clock_seconds", clock},
            {"fc_server_busy_seconds", fcBusySeconds},
            {"fc_server_samples", fcSamples},
            {"won", won}};
  }
};

}  // namespace

double curveNumber(const nlohmann::json& p, const char* key) {
  return p.contains(key) && p[key].is_number() && std::isfinite(p[key].get<double>()) ? p[key].get<double>()
                                                                                      : std::nan("");
}

namespace {

double number(const nlohmann::json& p, const char* key) { return curveNumber(p, key); }

// A run's outcome for the terminal: "loss 0.5210", "diverged at step 23 (stopped)" or "loss diverged".
std::string outcome(const Stage& s) {
  if (s.divergedAt >= 0) return strCat("diverged at step ", s.divergedAt, " (stopped)");
  if (std::isinf(s.loss)) return "loss diverged";
  char b[32];
  std::snprintf(b, sizeof b, "loss %.4f", s.loss);
  return b;
}

class Tuner {
 public:
  Tuner(AccuracyHarness* h, const TuneConfig& cfg, double mbit) : h_(h), cfg_(cfg), mbit_(mbit) {}

  nlohmann::json run() {
    // Merged FC's first g needs the FC server's time per sample, which the cold start measures.
    int first = cfg_.mergedFc ? 0 : firstGroups();
    // Cold start: synchronous, mu = 0.9, eta from the lowest up (appendix E-D).
    std::vector<Stage> cold;
    std::printf("  cold start: g = 1, momentum 0.9, learning rates from %g up\n", cfg_.lrs.front());
    for (double lr : cfg_.lrs) {
      cold.push_back(probe("cold-start probe", "", 0, 1, lr, 0.9));
      const Stage& s = cold.back();
      if (std::isinf(s.loss) || (cold.size() > 1 && s.loss > cold[cold.size() - 2].loss)) break;
    }
    Stage best = settle(cold, epochEnd(0));
    if (std::isinf(best.loss)) throw Error("every cold-start learning rate diverged: try lower --lrs");
    if (cfg_.mergedFc) {
      // Pooled over the cold start's runs (one short probe's warm-up weighs by its samples only).
      double busy = 0, samples = 0;
      for (const Stage& s : cold) {
        busy += s.fcBusySeconds;
        samples += s.fcSamples;
      }
      if (!(busy > 0 && samples > 0)) throw Error("the cold start's runs did not report the FC server's time");
      fcSecondsPerSample_ = busy / samples;
      first = firstGroups();
    }
    keep(best);
    Stage at = finishEpoch(best);  // the cold-start epoch, with the winner
    double mu = 0.9, eta = at.lr;
    int g = first;
    while (at.toStep < cfg_.steps) {
      std::printf("  epoch from step %d: g = %d, momentum up to %g, learning rate %g or %g\n", at.toStep, g, mu, eta,
                  eta / 10);
      Stage won = search(at, &g, mu, eta);
      at = finishEpoch(won);
      mu = at.momentum;
      eta = at.lr;
    }
    std::printf("  chose g = %d, momentum %g, learning rate %g\n", g, mu, eta);
    return summary(g, mu, eta);
  }

 private:
  // HE(g) for each g of CG: the smallest g within 5% of the best time per sample starts the search.
  // With merged FC (the paper's rule): the smallest g at which the FC server saturates (predicted load
  // of at least 95%; the largest g when it never does), its time per sample the one the cold start
  // measured.
  int firstGroups() {
    // As `poseidon plan --check` models a time-to-accuracy run on the emulated cluster.
    const planner::Workload whole = planner::paddedWorkload(resolveModel("lenet"), h_->batch, h_->padMs / 1e3);
    planner::Workload w = whole;
    planner::MergedFc fc;
    if (cfg_.mergedFc) {
      std::tie(w, fc) = planner::paddedMergedFc(resolveModel("lenet"), h_->batch, h_->padMs / 1e3, fcSecondsPerSample_);
    }
    planner::Cluster c = planner::emulatedCluster(planner::Cluster{}, h_->nodes, mbit_,
                                                  static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    c.pairBytes = h_->pairBytes;
    double best = kInf;
    std::vector<double> perSample, busy;  // seconds per sample through the whole cluster; the FC server's load
    for (int g : cfg_.groups) {
      const planner::GroupPrediction p = planner::predictGroups(w, c, g, cfg_.mergedFc ? &fc : nullptr);
      perSample.push_back(1 / p.samplesPerSecond);
      busy.push_back(p.fcServerBusy);
      best = std::min(best, perSample.back());
      he_.push_back({{"groups", g}, {"predicted_step_seconds", p.stepSeconds}});
      if (cfg_.mergedFc) {
        he_.back()["fc_server_busy"] = p.fcServerBusy;
        he_.back()["fc_server_seconds_per_sample"] = fcSecondsPerSample_;
      }
    }
    int first = cfg_.groups.back();
    std::printf("  HE model (planner%s): HE(g)/HE(1)", cfg_.mergedFc ? ", merged FC" : "");
    for (size_t i = 0; i < cfg_.groups.size(); ++i) {
      he_[i]["he_ratio"] = perSample[i] / perSample.front();
      std::printf("%s g%d %.3f", i ? "," : "", cfg_.groups[i], perSample[i] / perSample.front());
      if (cfg_.mergedFc) std::printf(" (FC server %.0f%% busy)", 100 * busy[i]);
    }
    for (size_t i = 0; i < cfg_.groups.size(); ++i) {
      const bool saturated = cfg_.mergedFc ? busy[i] >= 1 - kHeSaturation : perSample[i] <= best * (1 + kHeSaturation);
      if (saturated) {
        first = cfg_.groups[i];
        break;
      }
    }
    if (cfg_.mergedFc) std::printf("; FC server %.2f ms per sample (measured)", 1e3 * fcSecondsPerSample_);
    std::printf("; first g = %d\n", first);
    return first;
  }

  // The grid at g (and smaller g while mu = 0 wins), every probe from `at`'s state.
  Stage search(const Stage& at, int* g, double muLast, double eta) {
    const int end = epochEnd(at.toStep);
    for (;;) {
      std::vector<Stage> grid;
      for (double lr : {eta, eta / 10}) {
        for (double mu : cfg_.momenta) {
          if (mu <= muLast + 1e-12) grid.push_back(probe("probe", at.state, at.toStep, *g, lr, mu));
        }
      }
      const Stage& lowest =
          *std::min_element(grid.begin(), grid.end(), [](const Stage& a, const Stage& b) { return a.loss < b.loss; });
      if (lowest.momentum == 0 && !std::isinf(lowest.loss)) {
        const double lr = lowest.lr;
        for (double mu : {0.1, 0.2}) grid.push_back(probe("probe", at.state, at.toStep, *g, lr, mu));
      }
      Stage best = settle(grid, end);
      if (std::isinf(best.loss)) {
        if (*g == 1) throw Error("every probe diverged at g = 1: try lower --lrs");
      } else if (best.momentum > 0 || *g == 1) {
        keep(best);
        return best;
      }
      // Momentum 0 won (or every probe diverged): the implicit momentum is too high.
      int lower = 1;
      for (int c : cfg_.groups)
        if (c <= *g / 2) lower = c;
      *g = lower;
      std::printf("  momentum 0 %s: %d groups now\n", std::isinf(best.loss) ? "diverged too" : "won", *g);
    }
  }

  // The end of the epoch that step `from` is in (or the budget).
  int epochEnd(int from) const { return std::min(cfg_.steps, (from / cfg_.epochSteps + 1) * cfg_.epochSteps); }

  // The lowest loss wins; those within 5% of it are probed further (each from its own state) while
  // that stays within `end`. The caller keeps the final choice.
  Stage settle(std::vector<Stage>& grid, int end) {
    // Only the configurations still tied go on, so the ones compared have always run equally long.
    std::vector<size_t> candidates(grid.size());
    for (size_t i = 0; i < grid.size(); ++i) candidates[i] = i;
    for (int round = 0;; ++round) {
      size_t best = candidates.front();
      for (size_t i : candidates)
        if (grid[i].loss < grid[best].loss) best = i;
      std::vector<size_t> tied;
      for (size_t i : candidates)
        if (i != best && !std::isinf(grid[i].loss) && grid[i].loss <= grid[best].loss * (1 + kTie)) tied.push_back(i);
      if (tied.empty() || round == kMaxExtensions || grid[best].toStep + cfg_.probeSteps > end) return grid[best];
      tied.push_back(best);
      std::printf("  %zu within %.0f%% of the best: probing them further\n", tied.size(), kTie * 100);
      for (size_t i : tied) {
        const Stage& s = grid[i];
        grid[i] = probe("extension", s.state, s.toStep, s.groups, s.lr, s.momentum, &s);
      }
      candidates = tied;
    }
  }

  // A probe of (g, lr, mu) for probeSteps from `from` (a state directory; "" for the initial model).
  // `extends`: the probe it continues (its steps and clock are counted with it).
  Stage probe(const std::string& kind, const std::string& from, int fromStep, int g, double lr, double mu,
              const Stage* extends = nullptr) {
    Stage s = train(kind, from, fromStep, fromStep + cfg_.probeSteps, g, lr, mu);
    std::printf("    %-16s g=%d lr=%-7g momentum=%-4g steps %d-%d: %s (%.1f s)\n", kind.c_str(), g, lr, mu, fromStep,
                s.toStep, outcome(s).c_str(), s.clock);
    std::fflush(stdout);
    if (extends) {  // one stage: the extension's clock runs on from the probe's
      s.fromStep = extends->fromStep;
      nlohmann::json curve = extends->curve;
      for (auto p : s.curve) {
        p["seconds"] = p["seconds"].get<double>() + extends->clock;
        curve.push_back(p);
      }
      s.curve = curve;
      s.clock += extends->clock;
      s.runs.insert(s.runs.begin(), extends->runs.begin(), extends->runs.end());
    }
    return s;
  }

  // Trains from the winner's end state to the end of its epoch.
  Stage finishEpoch(const Stage& winner) {
    const int end = epochEnd(winner.fromStep);
    if (winner.toStep >= end) return winner;
    // A probe is short: a learning rate that won it may still diverge over an epoch. Then the epoch
    // is run again from the winner's state at a tenth of it (the diverged run was tuning's cost).
    double lr = winner.lr;
    for (int tries = 0;; ++tries) {
      Stage s = train("epoch", winner.state, winner.toStep, end, winner.groups, lr, winner.momentum);
      std::printf("    %-16s g=%d lr=%-7g momentum=%-4g steps %d-%d: %s (%.1f s)\n", "epoch", s.groups, s.lr,
                  s.momentum, s.fromStep, s.toStep, outcome(s).c_str(), s.clock);
      std::fflush(stdout);
      if (!std::isinf(s.loss)) {
        keep(s);
        return s;
      }
      if (tries == kEpochRetries) {
        throw Error(strCat("the epoch from step ", winner.toStep, " diverged down to learning rate ", lr));
      }
      lr /= 10;
      std::printf("  the epoch diverged: again from step %d at learning rate %g\n", winner.toStep, lr);
    }
  }

  Stage train(const std::string& kind, const std::string& from, int fromStep, int toStep, int g, double lr, double mu) {
    Stage s;
    s.kind = kind;
    s.groups = g;
    s.lr = lr;
    s.momentum = mu;
    s.fromStep = fromStep;
    s.toStep = toStep;
    s.state = strCat(h_->work, "/state-", mbit_, "-", ++runs_);
    fs::create_directories(s.state);
    if (!from.empty()) {
      // Resume from `from`'s checkpoint at fromStep (poseidon train's step-NNNNNNNNN): a copy, so that
      // other probes start from it too.
      char name[32];
      std::snprintf(name, sizeof name, "step-%09d", fromStep);
      const fs::path src = fs::path(from) / name;
      if (!fs::exists(src / "meta.json")) throw Error(strCat("no complete checkpoint ", src.string()));
      fs::copy(src, fs::path(s.state) / name, fs::copy_options::recursive);
    }
    AccuracySystem sys;
    sys.name = strCat("g", g, cfg_.mergedFc ? "fc" : "");
    sys.groups = g;
    sys.mergedFc = cfg_.mergedFc;
    sys.lr = lr;
    sys.momentum = mu;
    RunExtras extra;
    extra.tag = strCat("run", runs_);
    extra.maxSteps = toStep;
    extra.startStep = fromStep;
    // Every run starts and ends on a multiple of the probe length: a probe's last curve point is its end
    // model (with --probe-samples 0: its train_loss is the mean over the probe's second half, over the
    // last probe length for an epoch), and its one checkpoint is at its end (toStep is the only multiple
    // of itself in (fromStep, toStep]).
    const int p = cfg_.probeSteps;
    extra.curveEvery = kind == "epoch" || p % 2 != 0 ? p : p / 2;
    extra.quiet = true;
    // A run whose model goes non-finite skips the rest (the cold start's "early stop on divergence"):
    // only the steps up to there are on the clock.
    extra.trainArgs = {"--checkpoint",         s.state,     "--checkpoint-every",
                       std::to_string(toStep), "--regroup", "--allow-divergence"};
    if (cfg_.probeSamples > 0) {
      extra.trainArgs.insert(extra.trainArgs.end(), {"--curve-loss-samples", std::to_string(cfg_.probeSamples)});
    }
    const double wall0 = wallSeconds();
    AccuracyRun r = h_->run(sys, extra);
    wall_ += wallSeconds() - wall0;
    if (!r.ok) throw Error(strCat(kind, " g=", g, " lr=", lr, " momentum=", mu, " failed: ", r.error));
    s.clock = r.summary.value("train_clock_seconds", 0.0);
    const double fcUpdates = r.summary.value("fc_server_updates", 0.0);
    if (fcUpdates > 0) {  // a group round is k members' batches
      s.fcBusySeconds = r.summary.value("fc_server_busy_seconds", 0.0);
      s.fcSamples = fcUpdates * static_cast<double>(h_->nodes / g) * static_cast<double>(h_->batch);
    }
    s.curve = r.summary["curve"];
    const double loss = number(s.curve.back(), cfg_.probeSamples > 0 ? "sample_loss" : "train_loss");
    const auto& diverged = r.summary["diverged_at_step"];
    if (diverged.is_number()) s.divergedAt = diverged.get<int>();
    s.loss = s.divergedAt < 0 && std::isfinite(loss) && loss < 1e3 ? loss : kInf;
    s.runs = {stages_.size()};
    stages_.push_back(s);
    clock_ += s.clock;
    return s;
  }

  // A stage the trained model goes through (a grid's winner, an epoch): its runs are kept, every
  // other run was the tuning's cost. Its curve joins the model's path at the path's own clock plus
  // the tuning spent so far (as if each winner had run last in its grid).
  void keep(const Stage& s) {
    for (size_t i : s.runs) stages_[i].won = true;
    const double start = pathClock_;
    pathClock_ += s.clock;
    const double tuning = clock_ - pathClock_;
    for (const auto& p : s.curve) {
      nlohmann::json q = p;
      q["path_seconds"] = start + p["seconds"].get<double>();
      q["seconds"] = q["path_seconds"].get<double>() + tuning;
      path_.push_back(q);
    }
  }

  nlohmann::json summary(int g, double mu, double eta) const {
    double accSeconds = -1, lossSeconds = -1;
    int64_t accSteps = -1, lossSteps = -1;
    for (const auto& p : path_) {
      if (accSteps < 0 && number(p, "test_accuracy") >= h_->targetAccuracy) {
        accSteps = p["step"].get<int64_t>();
        accSeconds = p["seconds"].get<double>();
      }
      if (lossSteps < 0 && number(p, "train_loss") <= h_->targetLoss) {
        lossSteps = p["step"].get<int64_t>();
        lossSeconds = p["seconds"].get<double>();
      }
    }
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& s : stages_) stages.push_back(s.toJson());
    return {{"mbit", mbit_},
            {"chosen", {{"groups", g}, {"momentum", mu}, {"lr", eta}}},
            {"he_model", he_},
            {"stages", stages},
            {"path", path_},
            {"steps", path_.empty() ? 0 : path_.back()["step"].get<int64_t>()},
            {"clock_seconds", clock_},
            {"path_clock_seconds", pathClock_},
            {"tuning_seconds", clock_ - pathClock_},
            {"tuning_share", clock_ > 0 ? (clock_ - pathClock_) / clock_ : 0.0},
            {"wall_seconds", wall_},
            {"final_test_accuracy", path_.empty() ? 0.0 : number(path_.back(), "test_accuracy")},
            {"time_to_accuracy_s", accSeconds},
            {"steps_to_accuracy", accSteps},
            {"time_to_loss_s", lossSeconds},
            {"steps_to_loss", lossSteps}};
  }

  static double wallSeconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  AccuracyHarness* h_;
  TuneConfig cfg_;
  double mbit_;
  int runs_ = 0;
  std::vector<Stage> stages_;
  nlohmann::json he_ = nlohmann::json::array(), path_ = nlohmann::json::array();
  double clock_ = 0, pathClock_ = 0, wall_ = 0;
  double fcSecondsPerSample_ = 0;  // merged FC: measured by the cold start
};

}  // namespace

nlohmann::json tune(AccuracyHarness* harness, const TuneConfig& cfg, double mbit) {
  return Tuner(harness, cfg, mbit).run();
}

}  // namespace poseidon::cli
