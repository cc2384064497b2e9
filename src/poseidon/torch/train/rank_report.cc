// The results of one rank's run: traffic against Table 1, the final lines, the summary and the files.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/torch/train/rank_run.h"

namespace poseidon::pt {

namespace {

std::string human(double bytes) {
  char b[64];
  if (bytes >= 1e9)
    std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(b, sizeof b, "%.2f MB", bytes / 1e6);
  else
    std::snprintf(b, sizeof b, "%.1f kB", bytes / 1e3);
  return b;
}

}  // namespace

void RankRun::reportTraffic() {
  mode_->report();
  c_.pad.report([this](const std::vector<double>& mine) { return c_.allSum(mine); }, steps_, c_.rank, c_.world,
                c_.lead);
  {
    // Every rank's clock, steps and PS bytes (sent, received): compute groups' paces, and where the
    // shards' traffic went (train --servers).
    const size_t world = static_cast<size_t>(c_.world), me = static_cast<size_t>(c_.rank);
    std::vector<double> mine(4 * world, 0.0);
    mine[me] = trainClock_;
    mine[world + me] = static_cast<double>(steps_);
    if (c_.dist) {
      const TrafficTotals ps = c_.dist->node().counters().total(TrafficKind::kPS);
      mine[2 * world + me] = static_cast<double>(ps.bytesSent);
      mine[3 * world + me] = static_cast<double>(ps.bytesReceived);
    }
    const std::vector<double> all = c_.allSum(mine);
    auto part = [&](size_t k) {
      return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(k * world),
                                 all.begin() + static_cast<std::ptrdiff_t>((k + 1) * world));
    };
    trainClockPerRank_ = part(0);
    stepsPerRank_ = part(1);
    psSentPerRank_ = part(2);
    psReceivedPerRank_ = part(3);
  }
  if (!c_.dist) return;
  // Traffic over all ranks, against Table 1's prediction.
  Node& node = c_.dist->node();
  TrafficTotals ps = node.counters().total(TrafficKind::kPS), sfb = node.counters().total(TrafficKind::kSFB);
  auto pred = c_.dist->predictedFloats();
  const double eb = static_cast<double>(wireElementBytes(o_.wire));  // Table 1's floats, as the wire sends them
  const TrafficTotals local = node.counters().total(TrafficKind::kLocal);
  auto total = node.allSum({double(ps.bytesSent), double(sfb.bytesSent), double(ps.bytesSent + ps.bytesReceived),
                            double(sfb.bytesSent + sfb.bytesReceived), pred.first * eb, pred.second * eb,
                            double(local.bytesSent), double(node.urgentBytesSent())});
  localBytes_ = total[6];
  urgentBytes_ = total[7];
  psBytes_ = total[0];
  sfbBytes_ = total[1];
  predictedPs_ = total[4];
  predictedSfb_ = total[5];
  double moved = total[2] + total[3], predicted = total[4] + total[5];
  if (c_.lead && c_.world > 1 && !trainedNothing_) {
    std::printf("\nbytes on the wire (all ranks, sent): ps %s, sfb %s\n", human(psBytes_).c_str(),
                human(sfbBytes_).c_str());
    std::printf("bytes moved (sent + received) vs Table 1 prediction: %s vs %s (%.3fx)\n", human(moved).c_str(),
                human(predicted).c_str(), predicted > 0 ? moved / predicted : 0.0);
    if (node.book().localRanks() > 1) {
      std::printf("between the ranks of a machine (%d ranks each, not on the network): %s\n", node.book().localRanks(),
                  human(localBytes_).c_str());
    }
  }
}

void RankRun::printResult() const {
  if (!c_.lead) return;
  if (trainedNothing_) {
    std::printf("final test accuracy %.2f%% (the checkpoint's; no step trained), %.1f s\n", 100 * accuracy_,
                secondsSince(wallStart_));
  } else {
    std::printf("final test accuracy %.2f%%, %.0f images/s, %.1f s\n", 100 * accuracy_, imagesPerSecond(),
                secondsSince(wallStart_));
  }
  if (modelDiverged_ && o_.allowDivergence) {
    std::printf("stopped: the model diverged at step %lld (%lld steps trained; --allow-divergence)\n",
                static_cast<long long>(jobDivergedAt_), static_cast<long long>(steps_));
  }
  std::fflush(stdout);
  if (modelDiverged_ && !o_.allowDivergence) {
    std::fprintf(stderr, "%s\n", divergenceLine().c_str());
    std::fflush(stderr);
  }
}

std::string RankRun::divergenceLine() const {
  const int64_t step = jobDivergedAt_;
  const std::string who =
      divergenceFoundByOneRank() ? strCat("found by rank ", jobDivergedRank_) : std::string("found by every rank");
  // BSP: what rank 0 found, which every rank found (a layer's mean gradient).
  const std::string what = divergedAt_ == step && !divergedWhat_.empty() ? strCat(": ", divergedWhat_, " is not finite")
                                                                         : std::string(": the model is not finite");
  const double lr = warmedUpLearningRate(c_.lr, warmupSteps_, std::max<int64_t>(step - 1, 0));
  const std::string warmup =
      warmupSteps_ > 0 ? strCat(" (warm-up ", warmupSteps_, " steps, to ", c_.lr, ")") : std::string(" (no warm-up)");
  return strCat("poseidon train: error: the training diverged at step ", step, " (epoch ",
                std::max<int64_t>(step - 1, 0) / stepsPerEpoch_ + 1, "; ", who, what, ") at learning rate ", lr, warmup,
                "; try a lower --lr (e.g. ", c_.lr / 4,
                ") or a longer --warmup-steps, or --allow-divergence to "
                "record the run as a result");
}

void RankRun::saveParams() const {
  std::ofstream f(o_.saveParamsPath, std::ios::binary);
  for (const auto& p : c_.net.module->parameters()) {
    torch::Tensor t = p.detach().to(torch::kCPU).contiguous();
    f.write(reinterpret_cast<const char*>(t.data_ptr<float>()), static_cast<std::streamsize>(t.numel() * 4));
  }
  if (!f) throw IoError("cannot write " + o_.saveParamsPath);
}

nlohmann::json RankRun::summaryJson() const {
  nlohmann::json layers = nlohmann::json::array();
  ModelDesc desc = describeModule(*c_.net.module, c_.net.name);
  for (size_t l = 0, synced = 0; l < desc.layers.size(); ++l) {
    const auto& s = desc.layers[l];
    const bool onFcServer = mode_->onFcServer(s.name);
    std::string scheme = onFcServer      ? "fc-server"
                         : c_.world == 1 ? "local"
                                         : schemeName(c_.dist->lastSchemes()[synced]);
    if (!onFcServer) ++synced;
    layers.push_back({{"name", s.name},
                      {"type", layerTypeName(s.type)},
                      {"shape", s.params[0].shape},
                      {"params", s.numel()},
                      {"scheme", scheme}});
  }
  nlohmann::json summary = {
      {"model", o_.model},
      {"test_accuracy", accuracy_},
      {"epochs", o_.epochs},
      {"epochs_run", epochsJson_},
      {"workers", c_.world},
      {"device", c_.device.str()},
      {"torch_threads", torchThreads_},
      {"batch", o_.batch},
      {"group_batch", o_.groupBatch > 0 ? nlohmann::json(o_.groupBatch) : nlohmann::json()},
      {"lr", c_.lr},
      {"warmup_steps", warmupSteps_},
      {"momentum", o_.momentum},
      {"steps", steps_},
      {"seed", o_.seed},
      {"train_limit", o_.trainLimit > 0 ? nlohmann::json(o_.trainLimit) : nlohmann::json()},
      {"max_steps", o_.maxSteps > 0 ? nlohmann::json(o_.maxSteps) : nlohmann::json()},
      // This attempt's start: a resumed run (or a restart) trained from the checkpoint's iteration on,
      // and steps, train_seconds and wall_seconds are this attempt's.
      {"start_iteration", c_.startIteration},
      {"resumed_from", resumedFrom_.empty() ? nlohmann::json() : nlohmann::json(resumedFrom_)},
      // How many times the launcher restarted the job before this attempt (POSEIDON_RESTART_COUNT):
      // a summary with restarts > 0 counts only the last attempt's steps and seconds.
      {"restarts", hooks_.restartCount},
      {"allow_divergence", o_.allowDivergence},
      {"diverged", modelDiverged_},
      {"diverged_at_step", modelDiverged_ ? nlohmann::json(jobDivergedAt_) : nlohmann::json(nullptr)},
      {"diverged_rank",
       modelDiverged_ && divergenceFoundByOneRank() ? nlohmann::json(jobDivergedRank_) : nlohmann::json(nullptr)},
      {"images_per_sec", imagesPerSecond()},
      {"train_seconds", trainSeconds_},
      {"wall_seconds", secondsSince(wallStart_)},
      {"scheme_policy", schemePolicyName(o_.scheme)},
      {"wire", wirePrecisionName(o_.wire)},
      {"local_ranks", c_.dist ? c_.dist->node().book().localRanks() : o_.localRanks},  // the L in use
      {"local_bytes_sent", localBytes_},
      {"urgent_bytes_sent", urgentBytes_},
      {"tcp_rcvbuf", o_.tcpRcvbuf},
      {"group_push_window", o_.groupPushWindow},
      {"updates_in_forward", c_.dist ? c_.dist->updatesInForward() : 0},
      {"bytes_sent_by_scheme", {{"ps", psBytes_}, {"sfb", sfbBytes_}}},
      {"predicted_bytes_by_scheme", {{"ps", predictedPs_}, {"sfb", predictedSfb_}}},
      // The modes' results where they ran (TrainMode::addSummary), these where they did not.
      {"dropped_contributions_per_rank", std::vector<double>(static_cast<size_t>(c_.world), 0.0)},
      {"skipped_iterations_per_rank", std::vector<double>(static_cast<size_t>(c_.world), 0.0)},
      {"staleness_histogram", nlohmann::json::object()},
      {"max_group_lead", 0},
      {"fc_server_updates", 0},
      {"fc_server_busy_seconds", 0.0},
      {"pad_ms", c_.pad.padMs()},
      {"pad_jitter_ms", c_.pad.jitterMs()},
      {"pad_overruns_per_rank", c_.pad.overrunsPerRank()},
      {"max_compute_ms_per_rank", c_.pad.maxComputeMsPerRank()},
      {"mean_compute_ms", c_.pad.meanComputeMs()},
      {"train_clock_seconds", trainClock_},
      {"train_clock_seconds_per_rank", trainClockPerRank_},
      {"steps_per_rank", stepsPerRank_},
      {"ps_bytes_sent_per_rank", psSentPerRank_},
      {"ps_bytes_received_per_rank", psReceivedPerRank_},
      {"curve", curve_.json()},
      {"layers", layers}};
  summary.update(modeOptionsJson(o_));
  mode_->addSummary(summary);
  return summary;
}

void RankRun::writeOutputs() const {
  if (!o_.saveParamsPath.empty() && c_.lead) saveParams();
  if (c_.tracer) c_.tracer->writeFile(o_.tracePath + ".rank" + std::to_string(c_.rank));
  if (c_.lead && !o_.summaryPath.empty()) writeFileAtomically(o_.summaryPath, summaryJson().dump(2) + "\n", "summary");
}

}  // namespace poseidon::pt
