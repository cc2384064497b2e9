// poseidon experiment: measurements of the algorithms themselves (as opposed to
// `poseidon bench`, which measures throughput). One so far:
//
//   implicit-momentum  Omnivore's Theorem 1: train with explicit momentum 0 in g
//                      asynchronous compute groups and compare the expected
//                      update with momentum SGD at 1 - 1/g; --exact-race
//                      imposes the theorem's assumptions (torch/experiments.h).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/torch/experiments.h"

namespace poseidon::cli {

namespace {

std::vector<int> parseGroups(const std::string& text) {
  if (!text.empty() && text.back() == ',') {  // getline drops the empty last entry
    throw InvalidArgument(strCat("--groups expects a comma-separated list of integers >= 1, got '", text, "'"));
  }
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int g = 0;
    try {
      g = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || g < 1) {
      throw InvalidArgument(strCat("--groups expects a comma-separated list of integers >= 1, got '", text, "'"));
    }
    out.push_back(g);
  }
  if (out.empty()) throw InvalidArgument("--groups expects at least one group count");
  return out;
}

std::string histogramText(const std::map<int64_t, int64_t>& h) {
  std::string s;
  for (const auto& [staleness, n] : h) s += strCat(s.empty() ? "" : " ", staleness, ":", n);
  return s.empty() ? "-" : s;
}

// One group count's result, as the results file holds it: the staleness, and the fit of its mode
// (the wall-clock two-parameter fit, or the exact race's constrained fit and trajectory comparison).
nlohmann::json resultJson(int g, const pt::ImplicitMomentumResult& r, bool exactRace) {
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [s, n] : r.staleness) hist[std::to_string(s)] = n;
  nlohmann::json j = {{"groups", g},
                      {"updates", r.updates},
                      {"predicted_a", r.predictedA},
                      {"predicted_b", r.predictedB},
                      {"mean_staleness", r.meanStaleness},
                      {"staleness_a", r.stalenessA},
                      {"fresh_share", r.freshShare},
                      {"staleness_histogram", hist}};
  if (exactRace) {
    j.update({{"a", r.aConstrained},
              {"a_ci95", {r.aCi95[0], r.aCi95[1]}},
              {"b", r.lr * (1 - r.aConstrained)},
              {"lr", r.lr},
              {"lambda_max", r.lambdaMax},
              {"heavy_ball_error", r.heavyBallError},
              {"sgd_error", r.sgdError},
              {"trajectory_noise", r.noise}});
  } else {
    j.update({{"a", r.a}, {"b", r.b}, {"r2", r.r2}, {"a_iv", r.aIv}, {"b_iv", r.bIv}});
  }
  return j;
}

// The summary's columns, one entry per group count: g, a, its interval (null in the wall-clock
// mode, which has none), 1 - 1/g and the mean staleness's m / (1 + m).
nlohmann::json columns(const nlohmann::json& results) {
  nlohmann::json out = {{"g", nlohmann::json::array()},
                        {"a", nlohmann::json::array()},
                        {"a_ci95", nlohmann::json::array()},
                        {"one_minus_inv_g", nlohmann::json::array()},
                        {"staleness_a", nlohmann::json::array()}};
  for (const auto& r : results) {
    out["g"].push_back(r["groups"]);
    out["a"].push_back(r["a"]);
    out["a_ci95"].push_back(r.contains("a_ci95") ? r["a_ci95"] : nlohmann::json());
    out["one_minus_inv_g"].push_back(r["predicted_a"]);
    out["staleness_a"].push_back(r["staleness_a"]);
  }
  return out;
}

// The results file: the experiment's settings and each group count's fit.
void writeResults(const std::string& jsonPath, const pt::ImplicitMomentumOptions& o, const nlohmann::json& results) {
  nlohmann::json out = {{"experiment", "implicit-momentum"},
                        {"workers", o.workers},
                        {"steps", o.steps},
                        {"batch", o.batch},
                        {"lr", results.empty() || !o.exactRace ? nlohmann::json(o.lr) : results[0]["lr"]},
                        {"step_ms", o.stepMs},
                        {"mode", o.exactRace ? "exact-race" : "wall-clock"},
                        {"problem", o.exactRace ? "least-squares" : "softmax-regression"},
                        {"step_times", o.exactRace     ? "exponential race (drawn order)"
                                       : o.exponential ? "exponential"
                                                       : "fixed"},
                        {"seed", o.seed},
                        {"runs", o.runs},
                        {"burn_in", o.burnIn},
                        {"results", results}};
  out.update(columns(results));
  writeFileAtomically(jsonPath, out.dump(2) + "\n", "the results file");
  std::printf("results written to %s\n", jsonPath.c_str());
}

const char* kImplicitMomentumHelp =
    "Measures the momentum that asynchrony adds (Omnivore, section IV-C, Theorem 1, Fig. 6). For each\n"
    "G in --groups it trains a linear model on Fashion-MNIST with explicit momentum 0 in G asynchronous\n"
    "compute groups (--workers real nodes on loopback, one thread each; the shards hold the model and\n"
    "apply every group's update), records the model after every update, and compares the expected\n"
    "update with Theorem 1's momentum SGD, E V(t+1) = (1 - 1/G) E V(t) - (lr/G) E grad(W(t)),\n"
    "V(t+1) = W(t+1) - W(t). The expectations come from --runs independent runs (same initial model, own\n"
    "batches and step order) averaged.\n"
    "\n"
    "--exact-race imposes the theorem's assumptions: the groups' step times are i.i.d. exponential, so\n"
    "the next group to push is uniform over the groups and independent of the past; that order is drawn\n"
    "and each push (and the pull after it) is gated to it, with no clock involved. The problem is least\n"
    "squares on one-hot targets (a linear gradient, so E grad(W) = grad(E W)): the mean trajectory must\n"
    "be the heavy-ball trajectory (momentum 1 - 1/G, rate lr/G), and the experiment reports its distance\n"
    "from it and from plain SGD (both relative to how far the model moves; 'noise' is the mean's standard\n"
    "error on that scale), and a from E V(t+1) + lr grad(W(t)) = a (E V(t) + lr grad(W(t))), i.e. with\n"
    "b = lr (1 - a), with a bootstrap 95% interval over the runs. Defaults there: 128 runs, 16 turns per\n"
    "group, lr = 0.5 / the Hessian's largest eigenvalue.\n"
    "\n"
    "Without it (the wall-clock control): softmax regression, each step padded to an exponential time\n"
    "(mean --step-ms), and V(t+1) = a V(t) - b grad(W(t)) fitted by least squares (a) and with\n"
    "grad(W(t-1)) as the instrument for V(t) (a_iv); the first --burn-in updates are left out.\n"
    "Both print the staleness: m/(1+m) of its mean m is 1 - 1/G under the theorem's geometric law,\n"
    "P(tau = j) = (1/G)(1 - 1/G)^j, and P0 (the share of fresh updates) is 1/G.";

struct ImplicitMomentumFlags {
  pt::ImplicitMomentumOptions o;
  std::vector<int> groups;
  std::string jsonPath;
};

// The flags; false when --help was asked for (and printed).
bool parseImplicitMomentum(const std::vector<std::string>& args, ImplicitMomentumFlags& f) {
  pt::ImplicitMomentumOptions& o = f.o;
  std::string groupsFlag = "1,2,4,8";
  bool fixedTimes = false;
  int64_t seed = static_cast<int64_t>(o.seed);
  FlagSet flags("experiment implicit-momentum", "poseidon experiment implicit-momentum [flags]", kImplicitMomentumHelp);
  flags.addString("groups", &groupsFlag, "comma-separated group counts; each must divide --workers", "LIST");
  flags.addInt("workers", &o.workers, "workers (threads, each a node with a shard)", "N", IntRange::closed(1, 64));
  flags.addInt64("steps", &o.steps, "steps per group (default 40; the exact race: 16, G x N turns in all)", "N",
                 IntRange::closed(3, 1000000));
  flags.addInt64("batch", &o.batch, "per-worker batch size", "K", IntRange::closed(1, kMaxBatch));
  flags.addDouble("lr", &o.lr, "learning rate eta (default 0.05; the exact race: --lr-curvature / lambda_max)", "LR",
                  RealRange::above(0));
  flags.addBool("exact-race", &o.exactRace, "impose the exponential race's order on least squares (above)");
  flags.addDouble("lr-curvature", &o.lrCurvature,
                  "the exact race's default rate times the Hessian's largest eigenvalue", "C", RealRange::above(0));
  flags.addInt("bootstrap", &o.bootstrap, "resamples of the runs for a's 95% interval (exact race)", "B",
               IntRange::closed(1, 1000000));
  flags.addDouble("step-ms", &o.stepMs, "mean padded step time in milliseconds (wall clock)", "MS",
                  RealRange::above(0));
  flags.addBool("fixed-times", &fixedTimes, "every step takes --step-ms (not exponential: breaks Theorem 1's assumption)");
  flags.addInt("runs", &o.runs, "independent runs averaged into the expected updates (default 16; exact race 128)", "R",
               IntRange::closed(1, 100000));
  flags.addInt64("burn-in", &o.burnIn,
                 "updates left out of the wall-clock fit at the start (the groups start together)", "N",
                 IntRange::atLeast(0));
  flags.addInt64("fit-sample", &o.fitSample, "training images the batches are drawn from and the full gradient is over",
                 "N", IntRange::closed(1, 60000));
  flags.addInt64("seed", &seed, "seed of the initial model, the batches and the step times", "S", IntRange::atLeast(0));
  flags.addString("data", &o.dataDir, "Fashion-MNIST directory (default: /usr/share/datasets/fashion-mnist)", "DIR");
  flags.addInt("timeout", &o.timeoutMs, "timeout of every distributed wait, in milliseconds", "MS", IntRange::atLeast(1));
  flags.addString("json", &f.jsonPath, "write the results as JSON to FILE", "FILE");
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return false;
  }
  // Each mode's own flags: given to the other, they would change nothing.
  for (const char* clock : {"fixed-times", "step-ms", "burn-in"}) {
    if (o.exactRace && flags.wasSet(clock))
      throw InvalidArgument(strCat("--", clock, " is the wall-clock mode's; --exact-race draws the order"));
  }
  for (const char* race : {"lr-curvature", "bootstrap"}) {
    if (!o.exactRace && flags.wasSet(race))
      throw InvalidArgument(strCat("--", race, " is the exact race's; it needs --exact-race"));
  }
  o.exponential = !fixedTimes;
  o.seed = static_cast<uint64_t>(seed);
  if (o.exactRace && !flags.wasSet("runs")) o.runs = 128;
  if (o.exactRace && !flags.wasSet("steps")) o.steps = 16;
  if (o.exactRace && !flags.wasSet("lr")) o.lr = 0;  // from the curvature
  if (o.exactRace && o.runs < 2) throw InvalidArgument("--exact-race needs --runs >= 2 (its interval resamples them)");
  f.groups = parseGroups(groupsFlag);
  for (int g : f.groups) {
    if (o.workers % g != 0) throw InvalidArgument(strCat("--groups ", g, " does not divide --workers ", o.workers));
  }
  // G groups make --steps x G updates; the fit needs 3 after the burn-in (it would shrink it quietly).
  const int fewest = *std::min_element(f.groups.begin(), f.groups.end());
  if (!o.exactRace && o.burnIn > o.steps * fewest - 3) {
    throw InvalidArgument(strCat("--burn-in ", o.burnIn, " leaves fewer than 3 of the ", o.steps * fewest,
                                 " updates to fit at --groups ", fewest, " (--steps ", o.steps, " x ", fewest, ")"));
  }
  return true;
}

void printHeader(const pt::ImplicitMomentumOptions& o) {
  if (o.exactRace) {
    std::printf(
        "implicit momentum, exact race: least squares, %d workers, %lld turns per group, batch %lld, "
        "momentum 0, the next group to push drawn uniformly, %d runs averaged\n",
        o.workers, static_cast<long long>(o.steps), static_cast<long long>(o.batch), o.runs);
    std::printf("%6s %8s %10s %8s %8s %8s %17s %8s %8s %8s %6s %6s  %s\n", "groups", "updates", "staleness", "m/(1+m)",
                "1-1/g", "a", "a 95% interval", "HB err", "SGD err", "noise", "P0", "1/g",
                "staleness histogram (staleness:updates, all runs)");
  } else {
    std::printf(
        "implicit momentum: softmax regression, %d workers, %lld steps per group, batch %lld, lr %g, "
        "momentum 0, %s step times (mean %g ms), %d runs averaged, burn-in %lld\n",
        o.workers, static_cast<long long>(o.steps), static_cast<long long>(o.batch), o.lr,
        o.exponential ? "exponential" : "fixed", o.stepMs, o.runs, static_cast<long long>(o.burnIn));
    std::printf("%6s %8s %10s %8s %8s %8s %8s %10s %10s %6s %6s %6s  %s\n", "groups", "updates", "staleness", "m/(1+m)",
                "1-1/g", "a", "a_iv", "b", "lr/g", "R^2", "P0", "1/g",
                "staleness histogram (staleness:updates, all runs)");
  }
  std::fflush(stdout);
}

void printRow(const pt::ImplicitMomentumOptions& o, const pt::ImplicitMomentumResult& r) {
  const int g = r.groups;
  if (o.exactRace) {
    std::printf("%6d %8lld %10.2f %8.3f %8.3f %8.3f   [%6.3f, %6.3f] %8.4f %8.4f %8.4f %6.3f %6.3f  %s\n", g,
                static_cast<long long>(r.updates), r.meanStaleness, r.stalenessA, r.predictedA, r.aConstrained,
                r.aCi95[0], r.aCi95[1], r.heavyBallError, r.sgdError, r.noise, r.freshShare, 1.0 / g,
                histogramText(r.staleness).c_str());
  } else {
    std::printf("%6d %8lld %10.2f %8.3f %8.3f %8.3f %8.3f %10.3g %10.3g %6.3f %6.3f %6.3f  %s\n", g,
                static_cast<long long>(r.updates), r.meanStaleness, r.stalenessA, r.predictedA, r.a, r.aIv, r.b,
                r.predictedB, r.r2, r.freshShare, 1.0 / g, histogramText(r.staleness).c_str());
  }
  std::fflush(stdout);
}

int implicitMomentum(const std::vector<std::string>& args) {
  ImplicitMomentumFlags f;
  if (!parseImplicitMomentum(args, f)) return 0;
  pt::ImplicitMomentumOptions& o = f.o;
  // Fail now, not after the runs, and leave an earlier results file there untouched until they end.
  if (!f.jsonPath.empty()) checkOutputFile("--json", f.jsonPath);
  // The dataset is read once here, before the header, so a wrong --data fails alone (each group's
  // run reads it again; 0.3 s against minutes of runs).
  (void)data::loadFashionMnist(o.dataDir.empty() ? data::kDefaultFashionMnistDir : o.dataDir, true);
  printHeader(o);
  nlohmann::json results = nlohmann::json::array();
  for (int g : f.groups) {
    o.groups = g;
    pt::ImplicitMomentumResult r = pt::measureImplicitMomentum(o);
    printRow(o, r);
    results.push_back(resultJson(g, r, o.exactRace));
  }
  if (o.exactRace && !results.empty())
    std::printf("lr %g (lambda_max %g)\n", results[0]["lr"].get<double>(), results[0]["lambda_max"].get<double>());
  if (!f.jsonPath.empty()) writeResults(f.jsonPath, o, results);
  return 0;
}

const char* kUsage =
    "usage: poseidon experiment <name> [flags]\n"
    "\n"
    "experiments:\n"
    "  implicit-momentum  fit the momentum that g asynchronous compute groups add (Omnivore's Fig. 6)\n"
    "\n"
    "Run 'poseidon experiment <name> --help' for its flags.\n";

}  // namespace

int experimentCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    (args.empty() ? std::cerr : std::cout) << kUsage;  // no experiment named: a usage error
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "implicit-momentum") return implicitMomentum(rest);
  throw InvalidArgument(strCat("unknown experiment '", args[0], "' (try: implicit-momentum)"));
}

}  // namespace poseidon::cli
