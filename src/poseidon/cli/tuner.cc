// poseidon tune: Omnivore's automatic optimizer (Algorithm 1; appendix E-C and E-D of
// omnivore-2016-arxiv.txt). It picks the number of compute groups g, the explicit momentum mu and
// the learning rate eta by short probes of real training, trains with the winner for an epoch, and
// repeats. It trains through a TuneBackend: real processes on the emulated cluster (tune_harness.cc)
// or the regret experiment's virtual clock (tune_virtual.cc).
//
//   cold start   g = 1 (synchronous), mu = 0.9; eta over --lrs from the lowest up, each a probe from
//                the initial model; stop at the first that is worse than the one before or
//                diverges; then train the winner to the cold start's end (--cold-start-steps).
//   first g      the smallest g whose predicted time per sample (the HE model) is within 5% of the
//                best over --groups-list: where more asynchrony stops buying hardware efficiency
//                (the paper: the smallest g that saturates the FC server; without a merged FC this
//                is its analogue). With --merged-fc, the paper's rule: the smallest g whose
//                predicted FC server load is at least 95% (the largest listed when none is), the
//                server's time per sample measured in the cold start.
//   each epoch   at the current g, probe eta in {eta*, eta* / 10} (eta* / 10 only on a plateau:
//                below) and mu in --momenta, except mu above the last epoch's mu at eta* (the paper
//                prunes only there), every probe from the epoch's starting model. The lowest loss
//                wins, except that the last epoch's configuration (in its grid whenever g is unchanged)
//                stays unless beaten by more than 5%; configurations tied with the winner are probed
//                further (below). If the winner has mu = 0, mu = 0.1 and 0.2 are probed at its eta, as
//                long as it ran, and the three settled the same way; if mu = 0 still wins and g > 1,
//                move to the largest listed g of at most g / 2 and search again.
//                Then train the rest of the epoch from the winner's end state.
//
// A probe is 1/60 of an epoch by default (the paper: a minute per hour). A run's loss is scored
// from its points in its second half (TuneRunResult::points; the harness: the end model's mean loss
// on --probe-samples fixed training images, scored after the run and off the training clock, the
// paper's "lowest final loss"): their mean (the paper decides on "the loss of the past 50
// iterations"), with its standard error from the points' scatter about their least-squares line.
// Two runs tie when their losses differ by at most 2 standard errors of the difference (the probes'
// own spread, instead of the paper's fixed 5%, which decided on noise), capped at the 5% (a run
// that swings wildly must not tie with everything); with fewer than three points a run has no spread
// and the 5% band applies. A tie is probed further once, the best with its two
// closest challengers. Every decision is printed with its margin and band and kept in the summary's
// "decisions". A probe and its extensions make one stage, scored by the mean of its runs' scores (an
// extension adds evidence, it does not replace it); stages are compared only at equal steps, made of
// equal runs. The winner's steps are kept (the epoch continues from its state), so what tuning
// costs is the losers' time. Time is the training clock: seconds in training steps, summed over
// every run (probes and epochs), as `bench --accuracy` counts it.
//
// Every run skips its remaining steps once its model is found not finite (poseidon train
// --allow-divergence: the paper's early stop on divergence), so a diverged probe or epoch costs
// only the steps up to there.
// Beyond the paper, for a tuner that must not stop half-way: a probe that diverges loses; when
// every probe of a grid diverges, g is lowered as when mu = 0 wins (at g = 1 it is an error); an
// epoch that diverges is run again from the winner's state at a tenth of its learning rate (at
// most twice). The cold start probes g = 1 only (appendix E-D also searches every g there).
// Beyond the paper, for the trade-off Algorithm 1 is meant to make (measured: poseidon tune --regret,
// docs/omnivore.md): in the first grid after the cold start, while the winner is at eta*, ten times
// its rate is probed too (the synchronous eta* is too low once groups add implicit momentum); and a
// g lowered because mu = 0 won challenges that mu = 0 winner, run as long, right after its grid: it
// is kept only if it beats it by more than the paper's 5%, else the higher g stays and the search
// ends there (before the lower g's momentum check).
// Beyond the paper, against the short-horizon bias of a probe (a lower rate wins 10 steps and loses
// the epoch; measured, docs/omnivore.md): eta* / 10 is probed only once the epoch just trained says
// eta* stopped paying (a line through its curve's second half, steepened by 2 standard errors,
// promises under 5% over another epoch; when every probe at eta* diverges, eta* / 10 is probed
// after all);
// and the last epoch's configuration is kept unless a probe beats it by more than the paper's 5%,
// not by the probes' own spread, which understates how a probe varies from run to run.
#include "poseidon/cli/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "poseidon/cli/tuner_stage.h"
#include "poseidon/common/error.h"

namespace poseidon::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTie = 0.05;           // without a spread, losses within 5% of the best tie (the paper's)
constexpr double kTieZ = 2;             // with one, within 2 standard errors of the difference
constexpr int kMaxExtensions = 1;       // a tie is probed further at most this often
constexpr size_t kMaxChallengers = 2;   // and then the best with at most this many of those tied
constexpr int kEpochRetries = 2;        // a diverged epoch is run again at lr / 10 at most this often
constexpr double kHeSaturation = 0.05;  // the first g: within 5% of the best predicted time per sample

using tuner::name;
using tuner::outcome;
using tuner::Stage;

class Tuner {
 public:
  Tuner(TuneBackend* b, const TuneConfig& cfg) : b_(b), cfg_(cfg) {}

  nlohmann::json run() {
    // Merged FC's first g needs the FC server's time per sample, which the cold start measures.
    int first = cfg_.mergedFc ? 0 : firstGroups();
    // Cold start: synchronous, mu = 0.9, eta from the lowest up (appendix E-D).
    std::vector<Stage> cold;
    say("  cold start: g = 1, momentum 0.9, learning rates from %g up, to step %d\n", cfg_.lrs.front(), cfg_.coldSteps);
    for (double lr : cfg_.lrs) {
      cold.push_back(probe("cold-start probe", "", 0, 1, lr, 0.9));
      const Stage& s = cold.back();
      if (std::isinf(s.loss) || (cold.size() > 1 && s.loss > cold[cold.size() - 2].loss)) break;
    }
    Stage best = settle(cold, epochEnd(0), "cold start");
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
    Stage at = finishEpoch(best);  // the cold start, with the winner
    double mu = 0.9, eta = at.lr;
    int g = first;
    while (at.toStep < cfg_.steps) {
      say("  epoch from step %d: g = %d, learning rate %g (momentum up to %g), or %g on a plateau\n", at.toStep, g, eta,
          mu, eta / 10);
      Stage won = search(at, &g, mu, eta, /*firstGrid=*/g != 1 && at.groups == 1);
      at = finishEpoch(won);
      mu = at.momentum;
      eta = at.lr;
    }
    say("  chose g = %d, momentum %g, learning rate %g\n", g, mu, eta);
    return summary(g, mu, eta);
  }

 private:
  template <typename... A>
  void say(const char* f, A... a) const {
    if (!cfg_.verbose) return;
    std::printf(f, a...);
    std::fflush(stdout);
  }

  // HE(g) for each g of CG: the smallest g within 5% of the best time per sample starts the search.
  // With merged FC (the paper's rule): the smallest g at which the FC server saturates (predicted load
  // of at least 95%; the largest g when it never does), its time per sample the one the cold start
  // measured.
  int firstGroups() {
    double best = kInf;
    std::vector<double> perSample, busy;  // seconds per sample through the whole cluster; the FC server's load
    for (int g : cfg_.groups) {
      const TuneHe p = b_->predict(g, fcSecondsPerSample_);
      perSample.push_back(p.secondsPerSample);
      busy.push_back(p.fcServerBusy);
      best = std::min(best, perSample.back());
      he_.push_back({{"groups", g}, {"predicted_step_seconds", p.stepSeconds}});
      if (cfg_.mergedFc) {
        he_.back()["fc_server_busy"] = p.fcServerBusy;
        he_.back()["fc_server_seconds_per_sample"] = fcSecondsPerSample_;
      }
    }
    int first = cfg_.groups.back();
    std::string line = strCat("  HE model (", b_->heSource(), cfg_.mergedFc ? ", merged FC" : "", "): HE(g)/HE(1)");
    for (size_t i = 0; i < cfg_.groups.size(); ++i) {
      he_[i]["he_ratio"] = perSample[i] / perSample.front();
      char b[96];
      std::snprintf(b, sizeof b, "%s g%d %.3f", i ? "," : "", cfg_.groups[i], perSample[i] / perSample.front());
      line += b;
      if (cfg_.mergedFc) line += strCat(" (FC server ", static_cast<int>(std::lround(100 * busy[i])), "% busy)");
    }
    for (size_t i = 0; i < cfg_.groups.size(); ++i) {
      const bool saturated = cfg_.mergedFc ? busy[i] >= 1 - kHeSaturation : perSample[i] <= best * (1 + kHeSaturation);
      if (saturated) {
        first = cfg_.groups[i];
        break;
      }
    }
    if (cfg_.mergedFc) {
      char b[80];
      std::snprintf(b, sizeof b, "; FC server %.2f ms per sample (measured)", 1e3 * fcSecondsPerSample_);
      line += b;
    }
    say("%s; first g = %d\n", line.c_str(), first);
    return first;
  }

  // The grid at g (and smaller g while mu = 0 wins), every probe from `at`'s state.
  Stage search(const Stage& at, int* g, double muLast, double eta, bool firstGrid) {
    const int end = epochEnd(at.toStep);
    std::vector<Stage> zeroWinners;  // mu = 0 winners at higher g, still candidates (below)
    // Beyond the paper: eta* / 10 is probed only once eta* has stopped paying (see improving()).
    const bool probeTenth = !improving(at);
    for (;;) {
      std::vector<Stage> grid;
      std::vector<double> lrs{eta};
      if (probeTenth) lrs.push_back(eta / 10);
      for (double lr : lrs) {
        std::vector<double> mus = cfg_.momenta;
        // The last epoch's configuration is in its grid whenever g is unchanged (a momentum check's 0.1 or
        // 0.2 is not a listed momentum).
        if (lr == eta && *g == at.groups && std::find(mus.begin(), mus.end(), muLast) == mus.end()) {
          mus.push_back(muLast);
          std::sort(mus.begin(), mus.end());
        }
        for (double mu : mus) {
          // The paper prunes mu > mu_last at eta* only: at eta* / 10 a higher momentum keeps the step.
          if (lr == eta && mu > muLast + 1e-12) continue;
          grid.push_back(probe("probe", at.state, at.toStep, *g, lr, mu));
        }
      }
      Stage best = settle(grid, end, strCat("grid at g = ", *g), &at);
      if (!probeTenth && std::isinf(best.loss)) {  // every probe at eta* diverged: eta* / 10 after all
        std::vector<Stage> down;
        for (double mu : cfg_.momenta) down.push_back(probe("probe", at.state, at.toStep, *g, eta / 10, mu));
        best = settle(down, end, strCat("grid at g = ", *g, ", a tenth of the rate"));
      }
      // Beyond the paper: an adaptive grid where the cold start's synchronous eta* meets the first
      // asynchronous g. A winner at the top of the range says the range may be too low - the groups
      // add implicit momentum, which a larger rate with less explicit momentum can match (Theorem 1) -
      // and Algorithm 1's eta only goes down. Probe ten times the rate at the winner's momentum and
      // the next lower one, as long as the winner ran, up to the largest --lrs.
      for (double top = eta;
           firstGrid && !std::isinf(best.loss) && best.lr == top && top * 10 <= cfg_.lrs.back() * (1 + 1e-9);) {
        top *= 10;
        std::vector<Stage> up{best};
        const auto at_mu = std::find(cfg_.momenta.begin(), cfg_.momenta.end(), best.momentum);
        std::vector<double> mus{best.momentum};
        if (at_mu != cfg_.momenta.begin() && at_mu != cfg_.momenta.end()) mus.push_back(*(at_mu - 1));
        for (double mu : mus) up.push_back(probe("rate up", at.state, at.toStep, *g, top, mu));
        equalize(up);
        best = settle(up, end, "rate up");
      }
      // Beyond the paper: Algorithm 1 lowers g whenever mu = 0 wins, whatever the hardware efficiency
      // it gives up. Here a lower g challenges the mu = 0 winner it was lowered from, run as long as it
      // (each a round of its own g: equal steps are about equal time, the HE ratio apart), and is kept
      // only if it beats it by more than the paper's 5%: a 10-step probe cannot tell g apart more
      // finely (the lowest of three noisy probes wins otherwise, measured: tune --regret,
      // docs/omnivore.md). Where it does not, the higher g stays and the search stops there, before
      // the lower g's momentum check. Where every probe at the lower g diverged, the one above wins.
      if (!zeroWinners.empty()) {
        if (!std::isinf(best.loss)) zeroWinners.push_back(best);
        equalize(zeroWinners);
        best = settle(zeroWinners, end, "against momentum 0 at more groups", &zeroWinners.front(), "the higher g kept");
        zeroWinners.clear();
        if (best.groups != *g) {
          *g = best.groups;
          keep(best);
          return best;
        }
      }
      if (!std::isinf(best.loss) && best.momentum == 0) {
        // The paper: if the optimal mu is 0, try 0.1 and 0.2 as well - as long as the winner ran, so
        // the three compare on equal terms.
        std::vector<Stage> check{best};
        for (double mu : {0.1, 0.2}) check.push_back(probe("momentum check", at.state, at.toStep, *g, best.lr, mu));
        equalize(check);
        best = settle(check, end, "momentum check", &at);
      }
      if (std::isinf(best.loss) && *g == 1) throw Error("every probe diverged at g = 1: try lower --lrs");
      if (!std::isinf(best.loss) && (best.momentum > 0 || *g == 1)) {
        keep(best);
        return best;
      }
      // Momentum 0 won (or every probe diverged): the implicit momentum may be too high.
      if (!std::isinf(best.loss)) zeroWinners = {best};
      firstGrid = false;  // the rate-up is for the grid right after the cold start only
      int lower = 1;
      for (int c : cfg_.groups)
        if (c <= *g / 2) lower = c;
      *g = lower;
      say("  momentum 0 %s: %d groups now\n", std::isinf(best.loss) ? "diverged too" : "won", *g);
    }
  }

  // Whether the stage (the epoch just trained) was still gaining at its rate: its curve's losses over
  // its second half (all of it where that has fewer than three points), fitted by a line, may promise
  // more than kTie (the paper's 5%) of the last loss over another epoch: the slope kTieZ standard
  // errors steeper than fitted does, so a plateau is called only where the curve shows one (the cold
  // start's three noisy points do not: they rose in 2 of 5 runs and lowered the rate, measured:
  // tune --regret). Algorithm 1 probes eta* / 10 every
  // epoch, and a short probe favours the lower rate: its first steps settle into the valley the higher
  // rate bounces in, a gain the probe sees, while the higher rate's faster descent over an epoch is
  // beyond the probe's horizon (measured: tune --regret, docs/omnivore.md). So the rate comes down only
  // on a plateau, as a schedule on plateau does, judged from the whole epoch's curve rather than from a
  // probe. The gain is relative to the line's own loss at the last point (one point is noisy). Fewer
  // than three points in all: Algorithm 1's search.
  bool improving(const Stage& s) {
    std::vector<std::pair<double, double>> all, tail;
    for (const auto& p : s.curve) {
      const double step = curveNumber(p, "step"), loss = curveNumber(p, cfg_.lossKey.c_str());
      if (!std::isfinite(step) || !std::isfinite(loss)) continue;
      all.emplace_back(step, loss);
      if (step > (s.fromStep + s.toStep) / 2.0) tail.emplace_back(step, loss);
    }
    const auto& pts = tail.size() >= 3 ? tail : all;
    const LineFit fit = fitLine(pts);
    const double slope = fit.slope, se = fit.slopeSe;
    const double gain = -slope * cfg_.epochSteps,
                 last = pts.empty() ? kInf : fit.my + slope * (pts.back().first - fit.mx);
    // A plateau must be shown, not merely not excluded: the gain's upper bound (kTieZ standard errors
    // above the fit) under kTie. A few noisy points (the cold start's) leave the rate alone.
    const double upper = gain + kTieZ * se * cfg_.epochSteps;
    const bool gaining = std::isfinite(se) && last > 0 && upper > kTie * last;
    nlohmann::json d = {
        {"what", "rate"}, {"at_step", s.toStep}, {"points", pts.size()}, {"lower_rate_probed", !gaining}};
    if (std::isfinite(se)) {
      d["slope_per_step"] = slope;
      d["slope_se"] = se;
      d["epoch_gain"] = gain / last;
      d["epoch_gain_upper"] = upper / last;  // kTieZ standard errors above: a plateau is under kTie
      d["end_loss"] = last;  // the line's at the last point
      say("    rate: over its last %d points the loss falls %.1f%% an epoch (up to %.1f%%; a line through them): %s\n",
          static_cast<int>(pts.size()), 100 * gain / last, 100 * upper / last,
          gaining ? "still gaining, a tenth of the rate is not probed" : "a plateau, a tenth is probed too");
    }
    decisions_.push_back(d);
    return gaining;
  }

  // Extends every stage by probes until all end at the same step (the latest end among them).
  void equalize(std::vector<Stage>& stages) {
    int to = 0;
    for (const Stage& s : stages) to = std::max(to, s.toStep);
    for (Stage& s : stages) {
      while (s.toStep < to && !std::isinf(s.loss)) {
        const Stage was = s;
        s = probe("extension", was.state, was.toStep, was.groups, was.lr, was.momentum, &was);
      }
    }
  }

  // The end of the phase that step `from` is in: the cold start ends at coldSteps, then an epoch every
  // epochSteps (the last one cut at the budget).
  int epochEnd(int from) const {
    if (from < cfg_.coldSteps) return std::min(cfg_.steps, cfg_.coldSteps);
    return std::min(cfg_.steps, cfg_.coldSteps + ((from - cfg_.coldSteps) / cfg_.epochSteps + 1) * cfg_.epochSteps);
  }

  // Whether `s` ties with `best`: within kTieZ standard errors of the difference when both have a
  // spread, but never beyond kTie of the lower loss (the paper's band): the spread narrows the band to
  // what the probes can tell apart, and a run that swings wildly (an unstable rate) does not tie
  // everything by its own noise. Without a spread, kTie. `band` gets the band's width in loss.
  static bool ties(const Stage& s, const Stage& best, double* band) {
    const bool spread = std::isfinite(s.lossSe) && std::isfinite(best.lossSe);
    const double cap = kTie * std::min(s.loss, best.loss);  // 5% of the lower loss
    *band = spread ? std::min(kTieZ * std::hypot(s.lossSe, best.lossSe), cap) : cap;
    return !std::isinf(s.loss) && s.loss - best.loss <= *band;
  }

  // The lowest loss wins; those tied with it are probed further (each from its own state) while
  // that stays within `end`. The caller keeps the final choice. Every round's decision is printed
  // and recorded with its margin: the runner-up's loss above the winner's, and the band.
  // `last`: the incumbent, kept unless beaten by more than the paper's 5% (`kept` says why).
  Stage settle(std::vector<Stage>& grid, int end, const std::string& what, const Stage* last = nullptr,
               const std::string& kept = "the last epoch's configuration kept") {
    int incumbent = -1;  // the last epoch's (g, lr, mu), where the grid has it
    for (size_t i = 0; last != nullptr && i < grid.size(); ++i) {
      if (grid[i].groups == last->groups && std::fabs(grid[i].lr - last->lr) <= 1e-9 * last->lr &&
          std::fabs(grid[i].momentum - last->momentum) < 1e-12)
        incumbent = static_cast<int>(i);
    }
    // Only the configurations still tied go on, so the ones compared have always run equally long.
    std::vector<size_t> candidates(grid.size());
    for (size_t i = 0; i < grid.size(); ++i) candidates[i] = i;
    for (int round = 0;; ++round) {
      size_t best = candidates.front();
      for (size_t i : candidates)
        if (grid[i].loss < grid[best].loss) best = i;
      // The last epoch's configuration stays unless another is better by more than the paper's 5%: a
      // change must be earned. The probes' own spread is not the band here: it is the scatter of one
      // run's consecutive models, and understates how much a probe varies from run to run (standard
      // errors of 1e-4 where replicate probes differ by percents, docs/omnivore.md).
      const double incumbentBand =
          incumbent >= 0 ? kTie * std::min(grid[static_cast<size_t>(incumbent)].loss, grid[best].loss) : 0;
      if (incumbent >= 0 && static_cast<size_t>(incumbent) != best &&
          std::find(candidates.begin(), candidates.end(), static_cast<size_t>(incumbent)) != candidates.end() &&
          !std::isinf(grid[incumbent].loss) && grid[incumbent].loss - grid[best].loss <= incumbentBand) {
        record(strCat(what, " (", kept, ")"), grid[incumbent], &grid[best], incumbentBand, 1, false,
               /*paperBand=*/true);
        return grid[incumbent];
      }
      std::vector<size_t> tied;
      size_t second = best;
      double secondBand = 0;
      for (size_t i : candidates) {
        if (i == best) continue;
        double band = 0;
        if (ties(grid[i], grid[best], &band)) tied.push_back(i);
        if (second == best || grid[i].loss < grid[second].loss) {
          second = i;
          secondBand = band;
        }
      }
      const bool extend = !tied.empty() && round < kMaxExtensions && grid[best].toStep + cfg_.probeSteps <= end;
      record(what, grid[best], second == best ? nullptr : &grid[second], secondBand, tied.size(), extend);
      if (!extend) return grid[best];
      // The closest challengers only: a probe longer for each costs the losers' time.
      std::sort(tied.begin(), tied.end(), [&](size_t x, size_t y) { return grid[x].loss < grid[y].loss; });
      if (tied.size() > kMaxChallengers) tied.resize(kMaxChallengers);
      tied.push_back(best);
      for (size_t i : tied) {
        const Stage& s = grid[i];
        grid[i] = probe("extension", s.state, s.toStep, s.groups, s.lr, s.momentum, &s);
      }
      candidates = tied;
    }
  }

  // paperBand: the band is the paper's 5% whatever the spread (the last epoch's configuration kept).
  void record(const std::string& what, const Stage& best, const Stage* second, double band, size_t tied, bool extend,
              bool paperBand = false) {
    nlohmann::json d = {
        {"what", what},      {"at_step", best.fromStep},  {"to_step", best.toStep}, {"groups", best.groups},
        {"lr", best.lr},     {"momentum", best.momentum}, {"loss", best.loss},      {"tied", tied},
        {"extended", extend}};
    if (std::isfinite(best.lossSe)) d["loss_se"] = best.lossSe;
    std::string line = strCat("    ", what, ": ", name(best), " wins");
    if (second != nullptr && !std::isinf(best.loss)) {
      const double margin = second->loss - best.loss;
      d["runner_up"] = {{"groups", second->groups}, {"lr", second->lr}, {"momentum", second->momentum}};
      if (!std::isinf(second->loss)) d["runner_up"]["loss"] = second->loss;
      if (std::isfinite(second->lossSe)) d["runner_up"]["loss_se"] = second->lossSe;
      d["margin"] = std::isinf(margin) ? nlohmann::json("diverged") : nlohmann::json(margin);
      d["band"] = band;
      d["band_from"] = !paperBand && std::isfinite(best.lossSe) && std::isfinite(second->lossSe) ? "spread" : "5%";
      char b[160];
      if (std::isinf(margin))
        std::snprintf(b, sizeof b, "; runner-up %s diverged", name(*second).c_str());
      else if (margin < 0)  // the incumbent kept: the other was lower, but not by more than the band
        std::snprintf(b, sizeof b, "; %s lower by %.4f, within the band %.4f (%s)", name(*second).c_str(), -margin,
                      band, d["band_from"].get<std::string>().c_str());
      else
        std::snprintf(b, sizeof b, "; runner-up %s by %.4f (band %.4f, %s)", name(*second).c_str(), margin, band,
                      d["band_from"].get<std::string>().c_str());
      line += b;
    }
    if (tied > 0) line += strCat("; ", tied, " tied", extend ? ": probing them further" : ": no further probe");
    decisions_.push_back(d);
    say("%s\n", line.c_str());
  }

  // A probe of (g, lr, mu) for probeSteps from `from` (a state handle; "" for the initial model).
  // `extends`: the probe it continues (its steps and clock are counted with it).
  Stage probe(const std::string& kind, const std::string& from, int fromStep, int g, double lr, double mu,
              const Stage* extends = nullptr, int steps = 0) {
    Stage s = run(kind, from, fromStep, fromStep + (steps > 0 ? steps : cfg_.probeSteps), g, lr, mu);
    if (extends) {  // one stage: the extension's clock runs on from the probe's
      s.fromStep = extends->fromStep;
      nlohmann::json curve = extends->curve;
      for (auto p : s.curve) {
        p["seconds"] = p["seconds"].get<double>() + extends->clock;
        curve.push_back(p);
      }
      s.curve = curve;
      s.clock += extends->clock;
      s.fcBusySeconds += extends->fcBusySeconds;
      s.fcSamples += extends->fcSamples;
      s.runs.insert(s.runs.begin(), extends->runs.begin(), extends->runs.end());
      // The stage's score: the mean of its runs' (the probe's and each extension's), so that an
      // extension adds evidence instead of replacing it. Stages compare only at equal steps, made of
      // equal runs (equalize), so the earlier runs' higher losses weigh alike in each.
      if (!std::isinf(s.loss) && !std::isinf(extends->loss)) {
        const double n = static_cast<double>(s.runs.size());
        s.loss = (s.loss + (n - 1) * extends->loss) / n;
        s.lossSe = std::hypot(s.lossSe, (n - 1) * extends->lossSe) / n;
      }
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
      Stage s = run("epoch", winner.state, winner.toStep, end, winner.groups, lr, winner.momentum);
      if (!std::isinf(s.loss)) {
        keep(s);
        return s;
      }
      if (tries == kEpochRetries) {
        throw Error(strCat("the epoch from step ", winner.toStep, " diverged down to learning rate ", lr));
      }
      lr /= 10;
      say("  the epoch diverged: again from step %d at learning rate %g\n", winner.toStep, lr);
    }
  }

  Stage run(const std::string& kind, const std::string& from, int fromStep, int toStep, int g, double lr, double mu) {
    Stage s;
    s.kind = kind;
    s.groups = g;
    s.lr = lr;
    s.momentum = mu;
    s.fromStep = fromStep;
    s.toStep = toStep;
    TuneRunResult r = b_->train({kind, from, fromStep, toStep, g, lr, mu});
    s.state = r.state;
    s.clock = r.clock;
    s.divergedAt = r.divergedAt;
    s.fcBusySeconds = r.fcBusySeconds;
    s.fcSamples = r.fcSamples;
    s.curve = r.curve;
    std::tie(s.loss, s.lossSe) = scoreRun(r.points);
    if (s.divergedAt >= 0) s.loss = kInf;
    s.runs = {stages_.size()};
    stages_.push_back(s);
    clock_ += s.clock;
    say("    %-16s g=%d lr=%-7g momentum=%-4g steps %d-%d: %s (%.1f s)\n", kind.c_str(), g, lr, mu, fromStep, toStep,
        outcome(s).c_str(), s.clock);
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
      q["config"] = {{"groups", s.groups}, {"momentum", s.momentum}, {"lr", s.lr}};  // what trained it there
      path_.push_back(q);
    }
  }

  nlohmann::json summary(int g, double mu, double eta) const {
    double accSeconds = -1, lossSeconds = -1;
    int64_t accSteps = -1, lossSteps = -1;
    nlohmann::json atLoss;  // the configuration the path reached the loss target with
    for (const auto& p : path_) {
      if (accSteps < 0 && curveNumber(p, "test_accuracy") >= cfg_.targetAccuracy) {
        accSteps = p["step"].get<int64_t>();
        accSeconds = p["seconds"].get<double>();
      }
      if (lossSteps < 0 && curveNumber(p, cfg_.lossKey.c_str()) <= cfg_.targetLoss) {
        lossSteps = p["step"].get<int64_t>();
        lossSeconds = p["seconds"].get<double>();
        atLoss = p["config"];
      }
    }
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& s : stages_) stages.push_back(s.toJson());
    return {{"chosen", {{"groups", g}, {"momentum", mu}, {"lr", eta}}},
            {"he_model", he_},
            {"stages", stages},
            {"decisions", decisions_},
            {"path", path_},
            {"steps", path_.empty() ? 0 : path_.back()["step"].get<int64_t>()},
            {"clock_seconds", clock_},
            {"path_clock_seconds", pathClock_},
            {"tuning_seconds", clock_ - pathClock_},
            {"tuning_share", clock_ > 0 ? (clock_ - pathClock_) / clock_ : 0.0},
            {"final_test_accuracy", path_.empty() ? 0.0 : curveNumber(path_.back(), "test_accuracy")},
            {"time_to_accuracy_s", accSeconds},
            {"steps_to_accuracy", accSteps},
            {"time_to_loss_s", lossSeconds},
            {"steps_to_loss", lossSteps},
            {"config_at_loss_target", atLoss}};
  }

  TuneBackend* b_;
  TuneConfig cfg_;
  std::vector<Stage> stages_;
  nlohmann::json he_ = nlohmann::json::array(), path_ = nlohmann::json::array();
  nlohmann::json decisions_ = nlohmann::json::array();
  double clock_ = 0, pathClock_ = 0;
  double fcSecondsPerSample_ = 0;  // merged FC: measured by the cold start
};

}  // namespace

nlohmann::json tune(TuneBackend* backend, const TuneConfig& cfg) { return Tuner(backend, cfg).run(); }

}  // namespace poseidon::cli
