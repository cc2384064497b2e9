#include "poseidon/torch/trainer.h"

#include <torch/torch.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/common/log.h"
#include "poseidon/common/trace.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/torch/checkpoint.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/models.h"

namespace poseidon::pt {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

torch::Tensor batchImages(const data::Dataset& d, const std::vector<int64_t>& idx, size_t begin, size_t end) {
  const int64_t n = static_cast<int64_t>(end - begin), px = static_cast<int64_t>(d.rows) * d.cols;
  torch::Tensor x = torch::empty({n, 1, d.rows, d.cols});
  float* out = x.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) data::normalizeInto(d, idx[begin + i], out + i * px);
  return x;
}

torch::Tensor batchLabels(const data::Dataset& d, const std::vector<int64_t>& idx, size_t begin, size_t end) {
  torch::Tensor y = torch::empty({static_cast<int64_t>(end - begin)}, torch::kLong);
  auto* out = y.data_ptr<int64_t>();
  for (size_t i = begin; i < end; ++i) out[i - begin] = d.labels[idx[i]];
  return y;
}

// Sums small vectors over all ranks: each rank broadcasts its own in turn.
std::vector<double> allSum(Node& node, const std::vector<double>& mine) {
  std::vector<double> total(mine.size(), 0.0);
  std::vector<float> buf(mine.size() * 2);
  for (int root = 0; root < node.book().worldSize(); ++root) {
    // Doubles travel as pairs of floats (hi, lo) to keep counts exact.
    if (root == node.rank()) {
      for (size_t i = 0; i < mine.size(); ++i) {
        float hi = static_cast<float>(mine[i]);
        buf[2 * i] = hi;
        buf[2 * i + 1] = static_cast<float>(mine[i] - hi);
      }
    }
    node.broadcast(root, LayerBuffer::contiguous(buf.data(), static_cast<int64_t>(buf.size())));
    for (size_t i = 0; i < mine.size(); ++i) total[i] += double(buf[2 * i]) + double(buf[2 * i + 1]);
  }
  return total;
}

std::string human(double bytes) {
  char b[64];
  if (bytes >= 1e9) std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(b, sizeof b, "%.2f MB", bytes / 1e6);
  else std::snprintf(b, sizeof b, "%.1f kB", bytes / 1e3);
  return b;
}

// Progress for a supervising launcher (POSEIDON_PROGRESS_FILE): where the
// job is and where its newest checkpoint is, so a restart can say what was lost.
void writeProgress(const std::string& path, int64_t iteration, int64_t checkpointIteration) {
  if (path.empty()) return;
  try {
    writeFileAtomically(
        path, nlohmann::json{{"iteration", iteration}, {"checkpoint_iteration", checkpointIteration}}.dump() + "\n",
        "progress file");
  } catch (const IoError&) {
    // Best effort: without it a restart only says less about what was lost.
  }
}

}  // namespace

int trainRank(const TrainOptions& o, const RankEnv& env) {
  const auto wallStart = Clock::now();
  const int rank = env.rank, world = env.worldSize;
  const bool lead = rank == 0;
  setLogPrefix("rank " + std::to_string(rank));
  if (o.batch < 1) throw InvalidArgument(strCat("--batch must be at least 1, got ", o.batch));
  if (o.epochs < 1) throw InvalidArgument(strCat("--epochs must be at least 1, got ", o.epochs));
  if (!(o.lr > 0)) throw InvalidArgument(strCat("--lr must be positive, got ", o.lr));
  if (o.momentum < 0 || o.momentum >= 1) throw InvalidArgument(strCat("--momentum must be in [0, 1), got ", o.momentum));
  if (o.plain && world != 1) throw InvalidArgument("--plain runs the plain LibTorch loop and needs --workers 1");

  const int localWorkers = std::max(1, std::min(world, static_cast<int>(std::thread::hardware_concurrency())));
  int threads = o.threads > 0 ? o.threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / localWorkers);
  torch::set_num_threads(threads);
  torch::manual_seed(static_cast<int64_t>(o.seed));

  const std::string dataDir = o.dataDir.empty() ? data::kDefaultFashionMnistDir : o.dataDir;
  data::Dataset train = data::loadFashionMnist(dataDir, true);
  data::Dataset test = data::loadFashionMnist(dataDir, false);
  if (o.trainLimit > 0 && o.trainLimit < train.count) train.count = o.trainLimit;

  AnyNet net = makeModel(o.model);
  torch::optim::SGD optimizer(net.module->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum));

  const int64_t perRank = (train.count + world - 1) / world;
  const int64_t stepsPerEpoch = (perRank + o.batch - 1) / o.batch;

  // Resume from the newest complete checkpoint. Every rank reads it (the
  // directory must be visible to all ranks); the rendezvous then checks that
  // all ranks resume at the same iteration.
  CheckpointMeta meta;
  meta.model = o.model;
  meta.workers = world;
  meta.batch = o.batch;
  meta.seed = o.seed;
  meta.trainLimit = o.trainLimit;
  int64_t startIteration = 0, checkpointIteration = -1;
  if (std::string path = newestCheckpoint(o.checkpointDir); !path.empty()) {
    startIteration = loadCheckpoint(path, meta, *net.module, optimizer).iteration;
    checkpointIteration = startIteration;
    if (lead) {
      std::printf("resuming from %s (iteration %lld: epoch %lld, step %lld)\n", path.c_str(),
                  static_cast<long long>(startIteration), static_cast<long long>(startIteration / stepsPerEpoch + 1),
                  static_cast<long long>(startIteration % stepsPerEpoch));
      std::fflush(stdout);
    }
  }
  const int startEpoch = static_cast<int>(startIteration / stepsPerEpoch);
  auto checkpoint = [&](int64_t iteration) {
    if (!lead || o.checkpointDir.empty()) return;
    meta.iteration = iteration;
    saveCheckpoint(o.checkpointDir, meta, *net.module, optimizer);
    checkpointIteration = iteration;
  };

  std::unique_ptr<Tracer> tracer;
  if (!o.tracePath.empty()) tracer = std::make_unique<Tracer>(rank);

  std::unique_ptr<DistributedModel> dist;
  if (!o.plain) {
    DistributedOptions d;
    d.node.rank = rank;
    d.node.worldSize = world;
    d.node.masterAddr = resolveHost(env.masterAddr);
    d.node.masterPort = env.masterPort;
    d.node.bindHost = o.bindHost.empty() ? localAddressToward(d.node.masterAddr) : o.bindHost;
    d.node.timeout = std::chrono::milliseconds(o.timeoutMs);
    d.node.threads = o.syncThreads;
    d.node.settings.batch = o.batch;
    d.node.settings.pairBytes = o.pairBytes;
    d.node.settings.policy = o.scheme;
    d.node.settings.startIteration = startIteration;
    d.node.tracer = tracer.get();
    d.node.secret = o.secret;
    d.node.settings.dropStragglers = o.dropStragglers;
    d.node.settings.stragglerTimeoutMs = o.stragglerTimeoutMs;
    d.overlap = o.overlap;
    dist = std::make_unique<DistributedModel>(net.module, net.name, d, net.forward);
  }

  if (lead) {
    ModelDesc desc = describeModule(*net.module, net.name);
    std::printf("poseidon train: %s (%lld params) on Fashion-MNIST, %d worker%s x batch %lld, %d epochs, lr %g, "
                "momentum %g, scheme %s%s\n",
                net.name.c_str(), static_cast<long long>(desc.numel()), world, world > 1 ? "s" : "",
                static_cast<long long>(o.batch), o.epochs, o.lr, o.momentum, schemePolicyName(o.scheme),
                o.plain ? ", plain LibTorch (no Poseidon)" : (o.overlap ? ", wait-free backprop" : ", no overlap"));
    if (dist) {
      std::printf("\n%-8s %-5s %-12s %-6s %16s\n", "layer", "type", "shape", "scheme", "floats/iter/node");
      for (const auto& p : dist->plan(o.batch)) {
        std::printf("%-8s %-5s %-12s %-6s %16.0f\n", p.name.c_str(), layerTypeName(p.type), p.shape.c_str(),
                    world == 1 ? "local" : schemeName(p.scheme), world == 1 ? 0.0 : p.floatsPerIteration);
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  auto evaluate = [&]() -> double {
    torch::NoGradGuard guard;
    net.module->eval();
    int64_t correct = 0, seen = 0;
    std::vector<int64_t> idx = data::shardIndices(test.count, world, rank, 0, 0, /*shuffle=*/false);
    // Padding repeats a few samples on the last ranks; count each sample once.
    size_t limit = std::min<size_t>(idx.size(), static_cast<size_t>((test.count - rank + world - 1) / world));
    for (size_t b = 0; b < limit; b += 500) {
      size_t e = std::min(limit, b + 500);
      auto pred = net.forward(batchImages(test, idx, b, e)).argmax(1);
      correct += pred.eq(batchLabels(test, idx, b, e)).sum().item<int64_t>();
      seen += static_cast<int64_t>(e - b);
    }
    net.module->train();
    if (!dist) return static_cast<double>(correct) / static_cast<double>(seen);
    auto total = allSum(dist->node(), {static_cast<double>(correct), static_cast<double>(seen)});
    return total[0] / total[1];
  };

  nlohmann::json epochsJson = nlohmann::json::array();
  double accuracy = 0, trainSeconds = 0;
  int64_t steps = 0, images = 0, iteration = startIteration;
  bool stop = o.maxSteps > 0 && iteration >= o.maxSteps;
  net.module->train();
  for (int epoch = startEpoch; epoch < o.epochs && !stop; ++epoch) {
    std::vector<int64_t> idx = data::shardIndices(train.count, world, rank, o.seed, epoch);
    auto epochStart = Clock::now();
    double lossSum = 0;
    int64_t lossCount = 0, epochImages = 0;
    int nextReport = 1;
    const int64_t firstStep = epoch == startEpoch ? startIteration % stepsPerEpoch : 0;
    for (int64_t s = firstStep; s < stepsPerEpoch; ++s) {
      if (rank == o.faultRank && iteration == o.faultStep && o.restartCount == 0) {
        std::fprintf(stderr, "rank %d: fault injection (POSEIDON_FAULT): signal %d at iteration %lld\n", rank,
                     o.faultSignal, static_cast<long long>(iteration));
        std::fflush(stderr);
        raise(o.faultSignal);
      }
      size_t b = static_cast<size_t>(s * o.batch), e = std::min(idx.size(), b + static_cast<size_t>(o.batch));
      optimizer.zero_grad();
      if (dist && dist->skipIfBehind(optimizer)) {
        // A straggler: the others finished this iteration without us.
        epochImages += static_cast<int64_t>(e - b) * world;
      } else {
        auto stepStart = Clock::now();
        torch::Tensor x = batchImages(train, idx, b, e), y = batchLabels(train, idx, b, e);
        torch::Tensor out = dist ? dist->forward(x) : net.forward(x);
        torch::Tensor loss = torch::nll_loss(torch::log_softmax(out, 1), y);
        loss.backward();
        if (rank == o.slowRank && o.slowFactor > 1) {
          std::this_thread::sleep_for(std::chrono::duration<double>(secondsSince(stepStart) * (o.slowFactor - 1)));
        }
        if (dist) dist->step(optimizer);
        else optimizer.step();
        lossSum += loss.item<double>();
        ++lossCount;
        epochImages += static_cast<int64_t>(e - b) * world;
      }
      ++steps;
      ++iteration;
      if (o.checkpointEvery > 0 && iteration % o.checkpointEvery == 0) checkpoint(iteration);
      if (lead) writeProgress(o.progressPath, iteration, checkpointIteration);
      if (o.maxSteps > 0 && iteration >= o.maxSteps) {
        stop = true;
        break;
      }
      if (lead && !o.quiet && (s + 1) * 10 >= nextReport * stepsPerEpoch) {
        int pct = static_cast<int>(100 * (s + 1) / stepsPerEpoch);
        std::string bar(static_cast<size_t>(pct / 5), '#');
        bar.resize(20, '.');
        std::printf("epoch %d/%d [%s] %3d%%  loss %.4f  %.0f img/s\n", epoch + 1, o.epochs, bar.c_str(), pct,
                    lossSum / lossCount, epochImages / secondsSince(epochStart));
        std::fflush(stdout);
        while (nextReport * stepsPerEpoch <= (s + 1) * 10) ++nextReport;
      }
    }
    double epochSeconds = secondsSince(epochStart);
    trainSeconds += epochSeconds;
    images += epochImages;
    accuracy = evaluate();
    if (lead) {
      std::printf("epoch %d/%d done in %.1f s: train loss %.4f, test accuracy %.2f%%\n", epoch + 1, o.epochs,
                  epochSeconds, lossSum / std::max<int64_t>(lossCount, 1), 100 * accuracy);
      std::fflush(stdout);
    }
    epochsJson.push_back({{"epoch", epoch + 1}, {"train_loss", lossSum / std::max<int64_t>(lossCount, 1)},
                          {"test_accuracy", accuracy}, {"seconds", epochSeconds}});
    // Per-epoch checkpoints, unless --checkpoint-every already took this one.
    if (!stop && o.checkpointEvery <= 0) checkpoint(iteration);
  }

  // Traffic over all ranks, against Table 1's prediction.
  double psBytes = 0, sfbBytes = 0, predictedPs = 0, predictedSfb = 0;
  std::vector<double> dropped(world, 0.0), skipped(world, 0.0);
  if (dist && o.dropStragglers > 0) {
    std::vector<double> mine(2 * world, 0.0);
    mine[rank] = static_cast<double>(dist->node().droppedContributions());
    mine[world + rank] = static_cast<double>(dist->node().skippedIterations());
    auto all = allSum(dist->node(), mine);
    for (int r = 0; r < world; ++r) {
      dropped[r] = all[r];
      skipped[r] = all[world + r];
    }
    if (lead) {
      std::printf("straggler dropping: dropped layer contributions per rank [");
      for (int r = 0; r < world; ++r) std::printf("%s%.0f", r ? ", " : "", dropped[r]);
      std::printf("], skipped iterations per rank [");
      for (int r = 0; r < world; ++r) std::printf("%s%.0f", r ? ", " : "", skipped[r]);
      std::printf("]\n");
    }
  }
  if (dist) {
    Node& node = dist->node();
    TrafficTotals ps = node.counters().total(TrafficKind::kPS), sfb = node.counters().total(TrafficKind::kSFB);
    auto pred = dist->predictedFloats();
    auto total = allSum(node, {double(ps.bytesSent), double(sfb.bytesSent), double(ps.bytesSent + ps.bytesReceived),
                               double(sfb.bytesSent + sfb.bytesReceived), pred.first * 4, pred.second * 4});
    psBytes = total[0];
    sfbBytes = total[1];
    predictedPs = total[4];
    predictedSfb = total[5];
    double moved = total[2] + total[3], predicted = total[4] + total[5];
    if (lead && world > 1) {
      std::printf("\nbytes on the wire (all ranks, sent): ps %s, sfb %s\n", human(psBytes).c_str(), human(sfbBytes).c_str());
      std::printf("bytes moved (sent + received) vs Table 1 prediction: %s vs %s (%.3fx)\n", human(moved).c_str(),
                  human(predicted).c_str(), predicted > 0 ? moved / predicted : 0.0);
    }
  }
  double imagesPerSec = trainSeconds > 0 ? images / trainSeconds : 0;
  if (lead) {
    std::printf("final test accuracy %.2f%%, %.0f images/s, %.1f s\n", 100 * accuracy, imagesPerSec,
                secondsSince(wallStart));
    std::fflush(stdout);
  }
  if (!o.saveParamsPath.empty() && lead) {
    std::ofstream f(o.saveParamsPath, std::ios::binary);
    for (const auto& p : net.module->parameters()) {
      torch::Tensor c = p.detach().contiguous();
      f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(c.numel() * 4));
    }
    if (!f) throw IoError("cannot write " + o.saveParamsPath);
  }
  if (tracer) tracer->writeFile(o.tracePath + ".rank" + std::to_string(rank));
  if (lead && !o.summaryPath.empty()) {
    nlohmann::json layers = nlohmann::json::array();
    ModelDesc desc = describeModule(*net.module, net.name);
    for (size_t l = 0; l < desc.layers.size(); ++l) {
      const auto& s = desc.layers[l];
      std::string scheme = world == 1 ? "local" : schemeName(dist->lastSchemes()[l]);
      layers.push_back({{"name", s.name}, {"type", layerTypeName(s.type)}, {"shape", s.params[0].shape},
                        {"params", s.numel()}, {"scheme", scheme}});
    }
    nlohmann::json summary{{"model", o.model},
                           {"test_accuracy", accuracy},
                           {"epochs", o.epochs},
                           {"epochs_run", epochsJson},
                           {"workers", world},
                           {"batch", o.batch},
                           {"steps", steps},
                           {"images_per_sec", imagesPerSec},
                           {"train_seconds", trainSeconds},
                           {"wall_seconds", secondsSince(wallStart)},
                           {"scheme_policy", schemePolicyName(o.scheme)},
                           {"overlap", o.overlap},
                           {"plain", o.plain},
                           {"bytes_sent_by_scheme", {{"ps", psBytes}, {"sfb", sfbBytes}}},
                           {"drop_stragglers", o.dropStragglers},
                           {"dropped_contributions_per_rank", dropped},
                           {"skipped_iterations_per_rank", skipped},
                           {"predicted_bytes_by_scheme", {{"ps", predictedPs}, {"sfb", predictedSfb}}},
                           {"layers", layers}};
    writeFileAtomically(o.summaryPath, summary.dump(2) + "\n", "summary");
  }
  if (dist) dist->finish();
  return 0;
}

}  // namespace poseidon::pt
