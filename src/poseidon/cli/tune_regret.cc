// poseidon tune --regret: how far Omnivore's optimizer (cli/tuner.cc) lands from the best fixed
// configuration, measured where both can be run to convergence many times over: compute groups on a
// virtual clock (torch/virtual_race.h), threads in one process, no root.
//
//   the clock    a group's round takes compute 0.3 s + Exp(0.3 s) (--compute-ms, --compute-exp-ms)
//                plus the planner's communication time at g (planner::predictGroups for LeNet on
//                --nodes nodes at --mbit, the group batch split over the group's members): the
//                hardware-efficiency side of the trade-off. The statistical side is real: each
//                update is a real gradient of the group batch on the model the group pulled.
//   the budget   --steps rounds of every group; T = --steps x the synchronous round's mean.
//   the grid     g in --groups-list x mu in --momenta x eta in --lrs, --seeds seeds each, every run
//                to virtual time T, its loss on the fixed sample every T / 100.
//   the target   the lowest over the configurations of the median (over seeds) loss at
//                --target-at x T: the best configuration reaches it at about 60% of its budget.
//                A configuration's time is the median over its seeds of the first time its loss is
//                at most the target (a seed that never does: infinity); the grid's best is the lowest.
//                A loss here is the mean of the last 5 evaluations (5% of T; the paper's "loss of the
//                past 50 iterations"), so that a noisy run does not reach the target on a dip.
//   the tuner    --tuner-seeds runs at each --ratios epoch:probe ratio (the paper's 60:1, and 10:1),
//                with the budget --steps, epochs of --epoch-steps, the grid's lrs, momenta and g.
//                Its runs from step k draw the same batches (tune_virtual.cc), as poseidon train
//                resumed at step k reads the same data order.
//                Its choice at the end, run from scratch with the grid's seeds, gives the regret:
//                that time / the grid's best (and its rank in the grid); its tuning share is the
//                losers' share of its clock. The tuner's own path (tuning included) to the target
//                is reported beside it.
#include "poseidon/cli/tune_regret.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/tune_virtual.h"
#include "poseidon/cli/tuner.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/model/zoo.h"
#include "poseidon/planner/planner.h"
#include "poseidon/torch/virtual_race.h"

namespace poseidon::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kGridPoints = 100;  // loss evaluations over T
constexpr int kSmooth = 5;        // a curve's loss at a point: the mean of the last 5 (5% of T)

// A run's curve as the target and the times read it: each point the mean of the last kSmooth (the
// paper's "loss of the past 50 iterations"), so that a noisy run does not reach the target on a dip;
// infinite from a diverged (NaN) point on.
std::vector<double> smoothed(const std::vector<double>& l) {
  std::vector<double> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) {
    double sum = 0;
    const size_t from = i + 1 >= kSmooth ? i + 1 - kSmooth : 0;
    for (size_t j = from; j <= i; ++j) sum += std::isfinite(l[j]) ? l[j] : kInf;
    out[i] = sum / static_cast<double>(i + 1 - from);
  }
  return out;
}

struct RegretArgs {
  int nodes = 8, steps = 1800, epochSteps = 600, seeds = 3, tunerSeeds = 5, threads = 0, hidden = 64;
  int64_t batch = 64, evalSamples = 1024;
  double mbit = 300, computeMs = 300, computeExpMs = 300, targetAt = 0.6;
  std::string groupsFlag = "1,2,4", lrsFlag = "0.01,0.1,1", momentaFlag = "0,0.3,0.6,0.9", ratiosFlag = "60,10";
  std::string jsonPath, mdPath, dataDir, gridFrom, probeScore = "average";
  std::vector<int> groups, ratios;
  std::vector<double> lrs, momenta;
};

struct Config {
  int groups = 1;
  double momentum = 0, lr = 0;
  bool operator<(const Config& o) const {
    return std::tie(groups, momentum, lr) < std::tie(o.groups, o.momentum, o.lr);
  }
  std::string text() const { return strCat("g=", groups, " mu=", momentum, " lr=", lr); }
};

// One configuration run from scratch with every seed, to T.
struct ConfigResult {
  Config c;
  std::vector<double> times;                // per seed: first time at or below the target (inf: never)
  std::vector<std::vector<double>> losses;  // per seed, at T / kGridPoints, 2 T / kGridPoints, ...
  double time = kInf;                       // the median over seeds
  bool diverged = false;                    // some seed diverged
};

double median(std::vector<double> v) {
  if (v.empty()) return kInf;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs jobs [0, n) on `threads` threads.
void parallelFor(size_t n, int threads, const std::function<void(size_t)>& job) {
  std::atomic<size_t> next{0};
  std::mutex errorMutex;
  std::string error;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < n;) {
        try {
          job(i);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(errorMutex);
          if (error.empty()) error = e.what();
          next = n;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  if (!error.empty()) throw Error(error);
}

void addFlags(FlagSet& f, RegretArgs& a) {
  f.addDouble("mbit", &a.mbit, "the modelled cluster's links, Mbit/s (the planner's communication time)", "MBIT",
              RealRange::above(0));
  f.addInt("nodes", &a.nodes, "the modelled cluster's nodes", "N", IntRange::closed(1, 1024));
  f.addInt64("batch", &a.batch, "a group's batch (split over its members, the paper's setting)", "B",
             IntRange::closed(1, 60000));
  f.addDouble("compute-ms", &a.computeMs, "a round's deterministic compute, milliseconds", "MS", RealRange::atLeast(0));
  f.addDouble("compute-exp-ms", &a.computeExpMs, "a round's exponential compute, its mean in milliseconds", "MS",
              RealRange::atLeast(0));
  f.addInt("steps", &a.steps, "the budget: rounds of every group (T: this many synchronous rounds)", "N",
           IntRange::atLeast(2));
  f.addInt("epoch-steps", &a.epochSteps, "the tuner's epoch", "N", IntRange::atLeast(2));
  f.addString("ratios", &a.ratiosFlag, "the tuner's epoch:probe ratios, one set of tuner runs each", "LIST");
  f.addString("groups-list", &a.groupsFlag, "the grid's and the tuner's numbers of groups", "LIST");
  f.addString("lrs", &a.lrsFlag, "the grid's and the tuner's learning rates", "LIST");
  f.addString("momenta", &a.momentaFlag, "the grid's and the tuner's momenta", "LIST");
  f.addInt("seeds", &a.seeds, "seeds of each grid configuration", "N", IntRange::closed(1, 100));
  f.addInt("tuner-seeds", &a.tunerSeeds, "tuner runs at each ratio", "N", IntRange::closed(1, 100));
  f.addDouble("target-at", &a.targetAt, "the target: the best median loss at this share of T", "F",
              RealRange::closed(0.01, 1));
  f.addInt("hidden", &a.hidden, "the MLP's hidden width", "H", IntRange::closed(1, 4096));
  f.addInt64("eval-samples", &a.evalSamples, "the fixed training images the loss is taken on", "N",
             IntRange::closed(1, 60000));
  f.addInt("threads", &a.threads, "runs at once (default: the machine's cores)", "N", IntRange::closed(1, 256));
  f.addString("data", &a.dataDir, "Fashion-MNIST directory (default: Debian's)", "DIR");
  f.addString("probe-score", &a.probeScore,
              "average: a probe's loss is its tail average's (the mean model over its second half); last: its "
              "model's (the paper's final loss)",
              "average|last");
  f.addString("grid-from", &a.gridFrom,
              "reuse the grid of an earlier --json FILE made with the same settings (the tuner runs again)", "FILE");
  f.addString("json", &a.jsonPath, "write the grid, the tuner runs and the regret as JSON to FILE", "FILE");
  f.addString("markdown", &a.mdPath, "write the tables as Markdown to FILE", "FILE");
}

void finishArgs(RegretArgs& a) {
  for (const auto& s : splitList(a.groupsFlag)) {
    const int g = static_cast<int>(parseIntIn("each --groups-list entry", s, IntRange::closed(1, a.nodes)));
    if (a.nodes % g != 0) throw InvalidArgument(strCat("--groups-list: ", g, " does not divide --nodes ", a.nodes));
    a.groups.push_back(g);
  }
  for (const auto& s : splitList(a.lrsFlag)) a.lrs.push_back(parseRealIn("each --lrs entry", s, RealRange::above(0)));
  for (const auto& s : splitList(a.momentaFlag))
    a.momenta.push_back(parseRealIn("each --momenta entry", s, RealRange::rightOpen(0, 1)));
  for (const auto& s : splitList(a.ratiosFlag))
    a.ratios.push_back(static_cast<int>(parseIntIn("each --ratios entry", s, IntRange::closed(1, 1000))));
  for (auto* v : {&a.lrs, &a.momenta}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  std::sort(a.groups.begin(), a.groups.end());
  a.groups.erase(std::unique(a.groups.begin(), a.groups.end()), a.groups.end());
  if (a.groups.empty() || a.lrs.empty() || a.momenta.empty() || a.ratios.empty())
    throw InvalidArgument("--groups-list, --lrs, --momenta and --ratios must not be empty");
  if (a.groups.front() != 1) throw InvalidArgument("--groups-list must include 1 (the cold start is synchronous)");
  if (a.momenta.front() != 0) throw InvalidArgument("--momenta must include 0 (it decides when to halve g)");
  if (a.epochSteps > a.steps)
    throw InvalidArgument(strCat("--epoch-steps ", a.epochSteps, " exceeds --steps ", a.steps));
  for (int ratio : a.ratios) {
    const int probe = a.epochSteps / ratio;
    if (probe < 2 || a.epochSteps % ratio != 0 || a.steps % probe != 0) {
      throw InvalidArgument(strCat("--ratios ", ratio, ": a probe of --epoch-steps ", a.epochSteps, " / ", ratio,
                                   " must be a whole number of at least 2 steps that divides --steps ", a.steps));
    }
  }
  if (a.probeScore != "average" && a.probeScore != "last")
    throw InvalidArgument(strCat("--probe-score must be average or last, got '", a.probeScore, "'"));
  if (a.threads == 0) a.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The planner's communication time of a round at each g: LeNet on `nodes` nodes at `mbit`, the group
// batch split over a group's members, the round's deterministic compute as the padded compute.
std::map<int, double> plannedComm(const RegretArgs& a) {
  std::map<int, double> comm;
  planner::Cluster c;
  c.workers = a.nodes;
  c.linkBytes = a.mbit * 1e6 / 8;
  c.messageSeconds = planner::kMessageSecondsDefaultSlack;  // as the committed grids (--grid-from) were made
  for (int g : a.groups) {
    const int64_t perWorker = std::max<int64_t>(1, a.batch * g / a.nodes);
    const double compute = std::max(1e-6, a.computeMs / 1e3);
    const planner::Workload w = planner::paddedWorkload(resolveModel("lenet"), perWorker, compute);
    comm[g] = std::max(0.0, planner::predictGroups(w, c, g).stepSeconds - w.computeSeconds());
  }
  return comm;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// The tuner's own time to the target, read as the grid's runs are: the first point of its path whose
// mean with the 4 before it is at or below the target (-1: never).
double pathTimeToTarget(const nlohmann::json& path, double target) {
  std::vector<double> losses;
  for (const auto& p : path) {
    losses.push_back(curveNumber(p, "sample_loss"));
    if (smoothed(losses).back() <= target) return p["seconds"].get<double>();
  }
  return -1;
}

}  // namespace

int tuneRegretCommand(const std::vector<std::string>& args) {
  RegretArgs a;
  FlagSet flags("tune --regret", "poseidon tune --regret [--json F] [flags]",
                "The optimizer's regret (docs/omnivore.md): a grid of fixed configurations (g x momentum x\n"
                "learning rate, several seeds) and the tuner at each epoch:probe ratio, all trained on a virtual\n"
                "clock (a round: compute 0.3 s + Exp(0.3 s) + the planner's communication time at g) with real\n"
                "gradients of an MLP on Fashion-MNIST, threads in one process, no root. Regret: the time the\n"
                "tuner's choice (what its model reached the target with; its final one where it never did) takes\n"
                "from scratch to a loss target (the best configuration reaches it at --target-at of the budget),\n"
                "over the grid's best. A few minutes on 2 cores (133 s measured).");
  addFlags(flags, a);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  checkResultOutputs(a.jsonPath, a.mdPath);
  finishArgs(a);
  const auto wall0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(); };

  pt::VirtualRaceOptions o;
  o.dataDir = a.dataDir;
  o.batch = a.batch;
  o.hidden = a.hidden;
  o.evalSamples = a.evalSamples;
  o.computeSeconds = a.computeMs / 1e3;
  o.computeExpSeconds = a.computeExpMs / 1e3;
  o.commSeconds = plannedComm(a);
  const pt::VirtualRace race(o);
  pt::VirtualRace::setIntraOpThreads(1);
  const double round1 = o.computeSeconds + o.computeExpSeconds + race.commSeconds(1);
  const double horizon = a.steps * round1;
  std::printf(
      "poseidon tune --regret: MLP 784-%d-10 on Fashion-MNIST, group batch %lld, a round %g ms + Exp(%g ms) + "
      "the planner's communication (LeNet, %d nodes at %g Mbit/s):",
      a.hidden, static_cast<long long>(a.batch), a.computeMs, a.computeExpMs, a.nodes, a.mbit);
  for (const auto& [g, s] : o.commSeconds) std::printf(" g%d %.0f ms", g, 1e3 * s);
  std::printf("\nbudget %d steps = T %.0f virtual s; %d threads\n", a.steps, horizon, a.threads);
  std::fflush(stdout);

  // The grid, to T.
  std::vector<Config> configs;
  for (int g : a.groups)
    for (double mu : a.momenta)
      for (double lr : a.lrs) configs.push_back({g, mu, lr});
  std::vector<ConfigResult> grid(configs.size());
  std::mutex printMutex;
  std::atomic<size_t> done{0};
  auto runFromScratch = [&](const Config& c, ConfigResult* out) {
    out->c = c;
    out->losses.assign(a.seeds, {});
    for (int s = 0; s < a.seeds; ++s) {
      pt::VirtualRace::Run r;
      r.groups = c.groups;
      r.lr = c.lr;
      r.momentum = c.momentum;
      r.untilSeconds = horizon;
      r.evalEverySeconds = horizon / kGridPoints;
      r.seed = static_cast<uint64_t>(s + 1);
      const auto res = race.run(r);
      for (const auto& p : res.points) out->losses[s].push_back(p.loss);
      if (res.divergedAtUpdate >= 0) out->diverged = true;
      out->losses[s].resize(kGridPoints, std::nan(""));  // a diverged run: NaN from there on
    }
  };
  // What the grid's runs depend on: a grid from a file made with other settings is refused.
  const nlohmann::json gridKey = {{"mbit", a.mbit},
                                  {"nodes", a.nodes},
                                  {"batch", a.batch},
                                  {"compute_ms", a.computeMs},
                                  {"compute_exp_ms", a.computeExpMs},
                                  {"steps", a.steps},
                                  {"groups", a.groups},
                                  {"lrs", a.lrs},
                                  {"momenta", a.momenta},
                                  {"seeds", a.seeds},
                                  {"hidden", a.hidden},
                                  {"eval_samples", a.evalSamples}};
  bool loaded = false;
  if (!a.gridFrom.empty()) {
    std::ifstream in(a.gridFrom);
    if (!in) throw InvalidArgument(strCat("--grid-from: cannot read ", a.gridFrom));
    nlohmann::json old;
    try {
      old = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw InvalidArgument(strCat("--grid-from ", a.gridFrom, ": not JSON (", jsonErrorText(e), ")"));
    }
    if (old.value("grid_key", nlohmann::json()) != gridKey || !old.contains("grid_curves") ||
        old["grid_curves"].size() != configs.size()) {
      throw InvalidArgument(strCat("--grid-from ", a.gridFrom, ": its grid was made with other settings (",
                                   old.value("grid_key", nlohmann::json()).dump(), ")"));
    }
    for (size_t i = 0; i < configs.size(); ++i) {
      const auto& c = old["grid_curves"][i];
      grid[i].c = configs[i];
      grid[i].diverged = c["diverged"].get<bool>();
      for (const auto& seed : c["losses"]) {
        std::vector<double> l;
        for (const auto& v : seed) l.push_back(v.is_number() ? v.get<double>() : std::nan(""));
        grid[i].losses.push_back(l);
      }
    }
    loaded = true;
    std::printf("grid: %zu configurations x %d seeds from %s\n", configs.size(), a.seeds, a.gridFrom.c_str());
  }
  if (!loaded) std::printf("grid: %zu configurations x %d seeds\n", configs.size(), a.seeds);
  std::fflush(stdout);
  if (!loaded)
    parallelFor(configs.size(), a.threads, [&](size_t i) {
      runFromScratch(configs[i], &grid[i]);  // all its seeds in one job: their losses land in one result
      const size_t n = ++done;
      if (n % std::max<size_t>(1, configs.size() / 10) == 0 || n == configs.size()) {
        std::lock_guard<std::mutex> lock(printMutex);
        std::printf("  %zu of %zu configurations (%.0f s)\n", n, configs.size(), elapsed());
        std::fflush(stdout);
      }
    });

  // The target: the best median loss at targetAt x T.
  const size_t at = static_cast<size_t>(std::lround(a.targetAt * kGridPoints)) - 1;  // losses[k]: (k + 1) T / 100
  double target = kInf;
  for (const auto& r : grid) {
    std::vector<double> l;
    for (const auto& s : r.losses) l.push_back(smoothed(s)[at]);
    target = std::min(target, median(l));
  }
  if (!std::isfinite(target)) throw Error("every grid configuration diverged: try lower --lrs");
  auto timeOf = [&](ConfigResult& r) {
    r.times.clear();
    for (const auto& raw : r.losses) {
      const std::vector<double> s = smoothed(raw);
      double t = kInf;
      for (size_t k = 0; k < s.size(); ++k)
        if (s[k] <= target) {
          t = (k + 1) * horizon / kGridPoints;
          break;
        }
      r.times.push_back(t);
    }
    r.time = median(r.times);
  };
  for (auto& r : grid) timeOf(r);
  std::vector<size_t> order(grid.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return grid[x].time < grid[y].time; });
  const double best = grid[order.front()].time;
  if (!std::isfinite(best)) {  // an even --seeds: the target is between two seeds', which one may not reach
    throw Error(
        strCat("no configuration's median over ", a.seeds, " seeds reaches the target loss; use an odd --seeds"));
  }
  std::printf("target loss %.4f (the best median at %.0f%% of T); grid best %s: %.0f s; grid done in %.0f s\n", target,
              100 * a.targetAt, grid[order.front()].c.text().c_str(), best, elapsed());
  std::fflush(stdout);

  // The tuner, at each ratio and seed.
  struct TunerRun {
    int ratio = 0, seed = 0;
    nlohmann::json summary;
  };
  std::vector<TunerRun> tuners;
  for (int ratio : a.ratios)
    for (int s = 1; s <= a.tunerSeeds; ++s) tuners.push_back({ratio, s, {}});
  parallelFor(tuners.size(), a.threads, [&](size_t i) {
    TunerRun& t = tuners[i];
    TuneConfig cfg;
    cfg.steps = a.steps;
    cfg.epochSteps = a.epochSteps;
    cfg.probeSteps = a.epochSteps / t.ratio;
    const int tenth = std::max(1, a.epochSteps / 10);
    cfg.coldSteps = (tenth + cfg.probeSteps - 1) / cfg.probeSteps * cfg.probeSteps;
    cfg.groups = a.groups;
    cfg.lrs = a.lrs;
    cfg.momenta = a.momenta;
    cfg.targetLoss = target;
    cfg.lossKey = "sample_loss";
    cfg.verbose = false;
    VirtualBackend backend(race, horizon / kGridPoints, a.batch, static_cast<uint64_t>(1000 + 100 * t.ratio + t.seed),
                           a.probeScore == "average");
    t.summary = tune(&backend, cfg);
  });

  // Each tuner's final choice, from scratch (the grid's runs where it is one of the grid's).
  std::map<Config, ConfigResult> fromScratch;
  for (const auto& r : grid) fromScratch[r.c] = r;
  auto configOf = [](const nlohmann::json& c) {
    return Config{c["groups"].get<int>(), c["momentum"].get<double>(), c["lr"].get<double>()};
  };
  std::vector<Config> extra;
  for (const auto& t : tuners) {
    std::vector<Config> wanted{configOf(t.summary["chosen"])};
    if (t.summary["config_at_loss_target"].is_object()) wanted.push_back(configOf(t.summary["config_at_loss_target"]));
    for (const Config& k : wanted) {
      if (!fromScratch.count(k) && std::find_if(extra.begin(), extra.end(),
                                                [&](const Config& e) { return !(e < k) && !(k < e); }) == extra.end())
        extra.push_back(k);
    }
  }
  std::vector<ConfigResult> extraResults(extra.size());
  parallelFor(extra.size(), a.threads, [&](size_t i) { runFromScratch(extra[i], &extraResults[i]); });
  for (auto& r : extraResults) {
    timeOf(r);
    fromScratch[r.c] = r;
  }

  nlohmann::json chosen = nlohmann::json::array(), byRatio = nlohmann::json::object();
  auto rankOf = [&](double time) {
    int rank = 1;
    for (const auto& q : grid)
      if (q.time < time) ++rank;
    return rank;
  };
  std::printf("%-6s %-5s %-26s %8s %7s %5s %-26s %8s %7s %8s %7s\n", "ratio", "seed", "choice", "scratch s", "regret",
              "rank", "final choice", "scratch", "regret", "tuning", "path");
  for (int ratio : a.ratios) {
    std::vector<double> regrets, finalRegrets, shares, pathRegrets;
    for (const auto& t : tuners) {
      if (t.ratio != ratio) continue;
      // The choice: what the tuner trained with when its model reached the target (its final
      // configuration when it never did); the final one may have moved on (a lower rate, later).
      const bool reached = t.summary["config_at_loss_target"].is_object();
      const Config k = configOf(reached ? t.summary["config_at_loss_target"] : t.summary["chosen"]);
      const Config kf = configOf(t.summary["chosen"]);
      const ConfigResult& r = fromScratch.at(k);
      const ConfigResult& rf = fromScratch.at(kf);
      const double regret = r.time / best, finalRegret = rf.time / best,
                   share = t.summary["tuning_share"].get<double>();
      const double path = pathTimeToTarget(t.summary["path"], target);
      const double pathRegret = path >= 0 ? path / best : kInf;
      regrets.push_back(regret);
      finalRegrets.push_back(finalRegret);
      shares.push_back(share);
      pathRegrets.push_back(pathRegret);
      std::printf("%-6s %-5d %-26s %8s %7s %5d %-26s %8s %7s %7.0f%% %7s\n", strCat(ratio, ":1").c_str(), t.seed,
                  (k.text() + (reached ? "" : " (final)")).c_str(), fmtFinite(r.time, "%.0f").c_str(),
                  fmtFinite(regret, "%.3f").c_str(), rankOf(r.time), kf.text().c_str(),
                  fmtFinite(rf.time, "%.0f").c_str(), fmtFinite(finalRegret, "%.3f").c_str(), 100 * share,
                  fmtFinite(pathRegret, "%.3f").c_str());
      chosen.push_back({{"ratio", ratio},
                        {"seed", t.seed},
                        {"groups", k.groups},
                        {"momentum", k.momentum},
                        {"lr", k.lr},
                        {"at_target", reached},
                        {"from_scratch_s", num(r.time)},
                        {"from_scratch_s_per_seed", r.times},
                        {"regret", num(regret)},
                        {"rank", rankOf(r.time)},
                        {"final",
                         {{"groups", kf.groups},
                          {"momentum", kf.momentum},
                          {"lr", kf.lr},
                          {"from_scratch_s", num(rf.time)},
                          {"regret", num(finalRegret)},
                          {"rank", rankOf(rf.time)}}},
                        {"tuning_share", share},
                        {"path_time_to_target_s", num(path >= 0 ? path : kInf)},
                        {"path_regret", num(pathRegret)},
                        {"tuner", t.summary}});
    }
    byRatio[std::to_string(ratio)] = {{"regret_median", num(median(regrets))},
                                      {"regret_final_median", num(median(finalRegrets))},
                                      {"tuning_share_median", median(shares)},
                                      {"path_regret_median", num(median(pathRegrets))}};
    std::printf(
        "  %d:1: regret median %s (the choice at the target), %s (the final choice); tuning share median %.0f%%; "
        "own path (tuning included) / grid best %s\n",
        ratio, fmtFinite(median(regrets), "%.3f").c_str(), fmtFinite(median(finalRegrets), "%.3f").c_str(),
        100 * median(shares), fmtFinite(median(pathRegrets), "%.3f").c_str());
  }

  nlohmann::json gridJson = nlohmann::json::array();
  for (size_t i : order) {
    const auto& r = grid[i];
    std::vector<nlohmann::json> times;
    for (double t : r.times) times.push_back(num(t));
    std::vector<double> atTarget;
    for (const auto& s : r.losses) atTarget.push_back(smoothed(s)[at]);
    gridJson.push_back({{"groups", r.c.groups},
                        {"momentum", r.c.momentum},
                        {"lr", r.c.lr},
                        {"time_s", num(r.time)},
                        {"time_s_per_seed", times},
                        {"median_loss_at_target_time", num(median(atTarget))},
                        {"final_loss_per_seed",
                         [&] {
                           nlohmann::json l = nlohmann::json::array();
                           for (const auto& s : r.losses) l.push_back(num(s.back()));
                           return l;
                         }()},
                        {"diverged", r.diverged}});
  }
  nlohmann::json curves = nlohmann::json::array();  // every grid run's losses, for --grid-from
  for (const auto& r : grid) {
    nlohmann::json seeds = nlohmann::json::array();
    for (const auto& l : r.losses) {
      nlohmann::json v = nlohmann::json::array();
      for (double x : l) v.push_back(num(x));
      seeds.push_back(v);
    }
    curves.push_back({{"groups", r.c.groups},
                      {"momentum", r.c.momentum},
                      {"lr", r.c.lr},
                      {"diverged", r.diverged},
                      {"losses", seeds}});
  }
  const std::string first = std::to_string(a.ratios.front());
  nlohmann::json result = {{"command", commandLine("poseidon tune --regret", args)},
                           {"regret_median", byRatio[first]["regret_median"]},
                           {"regret_final_median", byRatio[first]["regret_final_median"]},
                           {"path_regret_median", byRatio[first]["path_regret_median"]},
                           {"tuning_share_median", byRatio[first]["tuning_share_median"]},
                           {"ratio", a.ratios.front()},
                           {"by_ratio", byRatio},
                           {"grid_best_s", best},
                           {"grid_best",
                            {{"groups", grid[order.front()].c.groups},
                             {"momentum", grid[order.front()].c.momentum},
                             {"lr", grid[order.front()].c.lr}}},
                           {"target_loss", target},
                           {"horizon_s", horizon},
                           {"comm_seconds",
                            [&] {
                              nlohmann::json j = nlohmann::json::object();
                              for (const auto& [g, s] : o.commSeconds) j[std::to_string(g)] = s;
                              return j;
                            }()},
                           {"chosen", chosen},
                           {"grid", gridJson},
                           {"config",
                            [&] {
                              nlohmann::json c = gridKey;
                              c.update({{"epoch_steps", a.epochSteps},
                                        {"ratios", a.ratios},
                                        {"tuner_seeds", a.tunerSeeds},
                                        {"target_at", a.targetAt},
                                        {"probe_score", a.probeScore}});
                              return c;
                            }()},
                           {"grid_key", gridKey},
                           {"grid_curves", curves},
                           {"wall_seconds", elapsed()}};
  std::printf(
      "regret median %s (%s:1), tuning share median %.0f%%, grid best %.0f s; %.0f s wall\n",
      fmtFinite(result["regret_median"].is_number() ? result["regret_median"].get<double>() : kInf, "%.3f").c_str(),
      first.c_str(), 100 * result["tuning_share_median"].get<double>(), best, elapsed());
  writeResultsJson(a.jsonPath, result);
  if (!a.mdPath.empty()) {
    writeRegretMarkdown(a.mdPath, result);
    std::printf("table: %s\n", a.mdPath.c_str());
  }
  return 0;
}

std::string fmtFinite(double v, const char* f) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace poseidon::cli
