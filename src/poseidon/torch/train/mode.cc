// TrainMode's defaults, which are BSP's, and the one place that reads the mode flags: the checks of
// their combinations and the choice of the mode.
#include "poseidon/torch/train/mode.h"

#include "poseidon/common/error.h"
#include "poseidon/torch/train/modes.h"
#include "poseidon/transport/van.h"

namespace poseidon::pt {

void TrainMode::connect() {
  c_.dist = std::make_unique<DistributedModel>(c_.net.module, c_.net.name, c_.jobOptions(), c_.net.forward);
}

std::string TrainMode::describe() const { return c_.o.overlap ? ", wait-free backprop" : ", no overlap"; }

void TrainMode::beginStep(double /*lr*/) { c_.optimizer->zero_grad(); }

TrainMode::Forward TrainMode::forward(const torch::Tensor& x) {
  Forward f;
  Clock::time_point start;
  if (c_.pad.on()) {
    // The compute clock starts once the step's model is here (in group mode beginForward waits
    // for the pull): a wait for the network is not device time and must not hide in the pad.
    c_.dist->beginForward();
    start = Clock::now();
    f.out = c_.net.forward(x);
    c_.dist->endForward(f.out);
  } else {
    start = Clock::now();
    f.out = c_.dist->forward(x);
  }
  f.ms = msSince(start);
  return f;
}

torch::Tensor TrainMode::compute(const torch::Tensor& x, const torch::Tensor& y, StepTimes& times) {
  Forward f = forward(x);
  torch::Tensor loss = torch::nll_loss(torch::log_softmax(f.out, 1), y);
  c_.pad.beforeBackward(f.ms);           // the modeled layers' time included: the pad's rest
  times.forwardMs = f.ms - f.modeledMs;  // the real compute, for the overrun count
  auto backwardStart = Clock::now();
  loss.backward();
  c_.slowDown();
  times.backwardMs = msSince(backwardStart);
  return loss;
}

void TrainMode::update(int64_t /*iteration*/) { c_.dist->step(*c_.optimizer); }

std::vector<torch::Tensor> TrainMode::modelCopy() {
  std::vector<torch::Tensor> params;
  torch::NoGradGuard guard;
  for (const auto& t : c_.net.module->parameters()) params.push_back(t.detach().clone());
  return params;
}

void TrainMode::finish() {
  if (c_.dist) c_.dist->finish();
}

void validateModeOptions(const TrainOptions& o, int world) {
  if (o.plain && world != 1) throw InvalidArgument("--plain runs the plain LibTorch loop and needs --workers 1");
  if (o.servers > world) {
    throw InvalidArgument(
        strCat("--servers ", o.servers, " exceeds the job's ", world, " ranks (each shard is a rank)"));
  }
  if (o.groups > 0) {
    if (o.plain) throw InvalidArgument("--groups needs Poseidon; --plain is the loop without it");
    if (world % o.groups != 0) {
      throw InvalidArgument(strCat("--groups ", o.groups, " must divide the ", world, " workers"));
    }
    if (o.dropStragglers > 0) throw InvalidArgument("--groups and --drop-stragglers cannot be combined");
    if (o.regroup && o.checkpointDir.empty()) {
      throw InvalidArgument("--regroup resumes a checkpoint with another number of groups: it needs --checkpoint");
    }
  } else if (o.mergedFc) {
    throw InvalidArgument(
        "--merged-fc runs the conv layers in compute groups and the FC layers on one FC server: "
        "it needs --groups");
  } else if (o.staleness >= 0) {
    throw InvalidArgument("--staleness bounds the lead of compute groups: it needs --groups");
  } else if (o.regroup) {
    throw InvalidArgument(
        "--regroup resumes a compute-group checkpoint with another number of groups: it needs --groups");
  }
  if (o.overlapForward) {
    // BSP: every rank applies the same mean layer by layer; compute groups: each layer of the next
    // round's pulled model is awaited as the forward reaches it.
    const char* other = o.mergedFc             ? "--merged-fc (the FC server's replies drive the forward)"
                        : o.dropStragglers > 0 ? "--drop-stragglers (a skipped step has no forward to apply it)"
                        : o.plain              ? "--plain (nothing is synchronized)"
                                               : nullptr;
    if (other) throw InvalidArgument(strCat("--overlap-forward cannot be combined with ", other));
  }
  // The coordinator says the same at rendezvous (every rank is a worker in train).
  if (o.dropStragglers > 0 && o.dropStragglers >= world) {
    throw InvalidArgument(strCat("--drop-stragglers ", o.dropStragglers, " must be less than the ", world, " workers"));
  }
  if (o.sendWindowBytes > 0 && o.sendWindowBytes < Van::kMinSendWindow) {
    throw InvalidArgument(
        strCat("--send-window must be 0 (FIFO links), -1 (the runtime's default) or at least ", Van::kMinSendWindow,
               " bytes (smaller ones cut messages into too many fragments), got ", o.sendWindowBytes));
  }
  if (o.sendWindowBytes != 0) {
    // The priority links order a BSP iteration's syncs; group rounds pull and push whole models.
    const char* other = o.groups > 0 ? "--groups (compute groups pull and push whole rounds, not layer by layer)"
                        : o.plain    ? "--plain (nothing is synchronized)"
                                     : nullptr;
    if (other) throw InvalidArgument(strCat("--send-window cannot be combined with ", other));
  }
  if (o.urgentLayers > 0 && o.sendWindowBytes == 0) {
    throw InvalidArgument("--urgent-layers needs priority links (--send-window BYTES)");
  }
}

std::unique_ptr<TrainMode> chooseMode(RankContext& c) {
  const TrainOptions& o = c.o;
  if (o.plain) return std::make_unique<PlainMode>(c);
  if (o.mergedFc) return std::make_unique<MergedFcMode>(c);
  if (o.groups > 0) return std::make_unique<GroupMode>(c);
  if (o.dropStragglers > 0) return std::make_unique<StragglerMode>(c);
  if (o.overlapForward) return std::make_unique<OverlappedMode>(c);
  return std::make_unique<BspMode>(c);
}

nlohmann::json modeOptionsJson(const TrainOptions& o) {
  return {{"plain", o.plain},
          {"overlap", o.overlap},
          {"overlap_forward", o.overlapForward},
          {"send_window", o.sendWindowBytes},
          {"urgent_layers", o.urgentLayers},
          {"host_queue", egressQueueName(o.hostQueue)},
          {"drop_stragglers", o.dropStragglers},
          {"groups", o.groups},
          {"staleness_bound", o.staleness},
          {"merged_fc", o.mergedFc},
          {"servers", o.servers}};
}

}  // namespace poseidon::pt
