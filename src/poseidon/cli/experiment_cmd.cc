// poseidon experiment: measurements of the algorithms themselves (as opposed to
// `poseidon bench`, which measures throughput). One so far:
//
//   implicit-momentum  Omnivore's Fig. 6 method: train with explicit momentum 0
//                      in g asynchronous compute groups, fit
//                      V(t+1) = a V(t) - b grad(W(t)) on the recorded updates,
//                      and print a next to Theorem 1's 1 - 1/g.
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
#include "poseidon/torch/experiments.h"

namespace poseidon::cli {

namespace {

std::vector<int> parseGroups(const std::string& text) {
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

// One group count's fit, as the results file holds it.
nlohmann::json resultJson(int g, const pt::ImplicitMomentumResult& r) {
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [s, n] : r.staleness) hist[std::to_string(s)] = n;
  return {{"groups", g},
          {"updates", r.updates},
          {"a", r.a},
          {"predicted_a", r.predictedA},
          {"b", r.b},
          {"predicted_b", r.predictedB},
          {"r2", r.r2},
          {"a_iv", r.aIv},
          {"b_iv", r.bIv},
          {"mean_staleness", r.meanStaleness},
          {"fresh_share", r.freshShare},
          {"staleness_histogram", hist}};
}

// The results file: the experiment's settings and each group count's fit.
void writeResults(const std::string& jsonPath, const pt::ImplicitMomentumOptions& o, const nlohmann::json& results) {
  nlohmann::json out = {{"experiment", "implicit-momentum"},
                        {"workers", o.workers},
                        {"steps", o.steps},
                        {"batch", o.batch},
                        {"lr", o.lr},
                        {"step_ms", o.stepMs},
                        {"step_times", o.exponential ? "exponential" : "fixed"},
                        {"seed", o.seed},
                        {"runs", o.runs},
                        {"burn_in", o.burnIn},
                        {"results", results}};
  writeFileAtomically(jsonPath, out.dump(2) + "\n", "the results file");
  std::printf("results written to %s\n", jsonPath.c_str());
}

int implicitMomentum(const std::vector<std::string>& args) {
  pt::ImplicitMomentumOptions o;
  std::string groupsFlag = "1,2,4,8", jsonPath;
  bool fixedTimes = false;
  int64_t seed = static_cast<int64_t>(o.seed);
  FlagSet flags("experiment implicit-momentum", "poseidon experiment implicit-momentum [flags]",
                "Measures the momentum that asynchrony adds (Omnivore, section IV-C, Theorem 1, Fig. 6). For each\n"
                "G in --groups it trains softmax regression on Fashion-MNIST with explicit momentum 0 in G\n"
                "asynchronous compute groups (--workers real nodes on loopback, one thread each; the shards hold\n"
                "the model and apply every group's update), records the model after every update, and fits\n"
                "V(t+1) = a V(t) - b grad(W(t)) by least squares, V(t+1) = W(t+1) - W(t), grad at W(t) over a\n"
                "fixed sample. Theorem 1 predicts a = 1 - 1/G and b = lr/G when step times are exponentially\n"
                "distributed; each step is padded to such a time (mean --step-ms). Prints a next to 1 - 1/G with\n"
                "the measured staleness of the updates. The expectations come from --runs independent runs\n"
                "(same initial model, own batches and step times) averaged; the first --burn-in updates are left\n"
                "out. a_iv is the same fit with grad(W(t-1)) as the instrument for V(t): unlike least squares it\n"
                "is not pulled towards 0 by the noise the runs leave in V(t). P0 is the share of updates with\n"
                "staleness 0: Theorem 1's staleness law is geometric, P(tau = j) = (1/G)(1 - 1/G)^j, so P0 = 1/G\n"
                "where it holds.");
  flags.addString("groups", &groupsFlag, "comma-separated group counts; each must divide --workers", "LIST");
  flags.addInt("workers", &o.workers, "workers (threads, each a node with a shard)", "N", IntRange::closed(1, 64));
  flags.addInt64("steps", &o.steps, "steps per group", "N", IntRange::closed(3, 1000000));
  flags.addInt64("batch", &o.batch, "per-worker batch size", "K", IntRange::closed(1, kMaxBatch));
  flags.addDouble("lr", &o.lr, "learning rate eta", "LR", RealRange::above(0));
  flags.addDouble("step-ms", &o.stepMs, "mean padded step time in milliseconds", "MS", RealRange::above(0));
  flags.addBool("fixed-times", &fixedTimes, "every step takes --step-ms (not exponential: breaks Theorem 1's assumption)");
  flags.addInt("runs", &o.runs, "independent runs averaged into the expected updates", "R", IntRange::closed(1, 1000));
  flags.addInt64("burn-in", &o.burnIn, "updates left out of the fit at the start (the groups start together)", "N",
                 IntRange::atLeast(0));
  flags.addInt64("fit-sample", &o.fitSample, "training images the full gradient at W(t) is taken over", "N",
                 IntRange::closed(1, 60000));
  flags.addInt64("seed", &seed, "seed of the initial model, the batches and the step times", "S", IntRange::atLeast(0));
  flags.addString("data", &o.dataDir, "Fashion-MNIST directory (default: /usr/share/datasets/fashion-mnist)", "DIR");
  flags.addInt("timeout", &o.timeoutMs, "timeout of every distributed wait, in milliseconds", "MS", IntRange::atLeast(1));
  flags.addString("json", &jsonPath, "write the results as JSON to FILE", "FILE");
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  o.exponential = !fixedTimes;
  o.seed = static_cast<uint64_t>(seed);
  const std::vector<int> groups = parseGroups(groupsFlag);
  for (int g : groups) {
    if (o.workers % g != 0) throw InvalidArgument(strCat("--groups ", g, " does not divide --workers ", o.workers));
  }
  if (!jsonPath.empty()) writeFileAtomically(jsonPath, "{}\n", "the results file");  // fail now, not after the runs

  std::printf("implicit momentum: softmax regression, %d workers, %lld steps per group, batch %lld, lr %g, "
              "momentum 0, %s step times (mean %g ms), %d runs averaged, burn-in %lld\n",
              o.workers, static_cast<long long>(o.steps), static_cast<long long>(o.batch), o.lr,
              o.exponential ? "exponential" : "fixed", o.stepMs, o.runs, static_cast<long long>(o.burnIn));
  std::printf("%6s %8s %10s %8s %8s %8s %10s %10s %6s %6s %6s  %s\n", "groups", "updates", "staleness", "1-1/g", "a",
              "a_iv", "b", "lr/g", "R^2", "P0", "1/g", "staleness histogram (staleness:updates, all runs)");
  std::fflush(stdout);
  nlohmann::json results = nlohmann::json::array();
  for (int g : groups) {
    o.groups = g;
    pt::ImplicitMomentumResult r = pt::measureImplicitMomentum(o);
    std::printf("%6d %8lld %10.2f %8.3f %8.3f %8.3f %10.3g %10.3g %6.3f %6.3f %6.3f  %s\n", g,
                static_cast<long long>(r.updates), r.meanStaleness, r.predictedA, r.a, r.aIv,
                r.b, r.predictedB, r.r2, r.freshShare, 1.0 / g,
                histogramText(r.staleness).c_str());
    std::fflush(stdout);
    results.push_back(resultJson(g, r));
  }
  if (!jsonPath.empty()) writeResults(jsonPath, o, results);
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
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "implicit-momentum") return implicitMomentum(rest);
  throw InvalidArgument(strCat("unknown experiment '", args[0], "' (try: implicit-momentum)"));
}

}  // namespace poseidon::cli
