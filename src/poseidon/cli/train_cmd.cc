// poseidon train: the main job. Without RANK in the environment it launches
// itself once per worker on this machine; with RANK/WORLD_SIZE (torchrun,
// poseidon launch) or mpirun/Slurm variables it runs as that rank.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <filesystem>
#include <iostream>

#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/common/error.h"
#include "poseidon/common/trace.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"
#include "poseidon/torch/train/outputs.h"
#include "poseidon/torch/trainer.h"
#include "poseidon/transport/van.h"

namespace poseidon::cli {

namespace {
// The launcher's name when train starts its own workers: their POSEIDON_LAUNCHER (RankEnv::source).
constexpr const char* kOwnLauncher = "poseidon train";

// The fields of "A:B:C", each whole: no spaces, no trailing text (sscanf took "1: 5" and "1:1:kill extra").
std::vector<std::string> fieldsOf(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t colon; (colon = text.find(':', at)) != std::string::npos; at = colon + 1) out.push_back(text.substr(at, colon - at));
  out.push_back(text.substr(at));
  return out;
}

// A rank: digits only, at most 9 of them (one past int's range was read as 1215752191); validateTrainOptions
// then checks it against the job's ranks.
bool parseRank(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoi(s);
  return true;
}

bool parseWholeNumber(const std::string& s, double* out, bool integer) {
  if (s.empty() || s.find_first_of(" \t\n") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  const double v = integer ? static_cast<double>(std::strtoll(s.c_str(), &end, 10)) : std::strtod(s.c_str(), &end);
  if (*end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

// Set by a supervising launcher (poseidon launch / train) and by tests.
void readReliabilityEnvironment(pt::TrainHooks& o) {
  if (const char* p = std::getenv("POSEIDON_PROGRESS_FILE")) o.progressPath = p;
  // The restarts so far: poseidon launch/train's, else torchrun's (its --max-restarts).
  if (const char* r = std::getenv("POSEIDON_RESTART_COUNT")) o.restartCount = std::atoi(r);
  else if (const char* t = std::getenv("TORCHELASTIC_RESTART_COUNT")) o.restartCount = std::atoi(t);
  // Empty is unset, as for every other variable (docs/errors.md).
  if (const char* f = std::getenv("POSEIDON_FAULT"); f && *f) {
    const std::vector<std::string> fields = fieldsOf(f);
    int rank = -1;
    double step = -1;
    if (fields.size() != 3 || !parseRank(fields[0], &rank) || !parseWholeNumber(fields[1], &step, true) || step < 0 ||
        (fields[2] != "kill" && fields[2] != "stop")) {
      throw InvalidArgument(strCat("POSEIDON_FAULT='", f, "' is not RANK:ITERATION:kill|stop (RANK, ITERATION >= 0)"));
    }
    o.faultRank = rank;
    o.faultStep = static_cast<int64_t>(step);
    o.faultSignal = fields[2] == "kill" ? SIGKILL : SIGSTOP;
  }
  if (const char* s = std::getenv("POSEIDON_SLOW"); s && *s) {
    const std::vector<std::string> fields = fieldsOf(s);
    if (fields.size() != 2 || !parseRank(fields[0], &o.slowRank) || !parseWholeNumber(fields[1], &o.slowMs, false) ||
        !(o.slowMs >= 0) || o.slowMs > kMaxPadMs) {
      throw InvalidArgument(strCat("POSEIDON_SLOW='", s, "' is not RANK:MS (RANK >= 0, MS in [0, ",
                                   static_cast<long long>(kMaxPadMs), "] milliseconds per step)"));
    }
  }
}

// poseidon train's settings: the user's options, the hooks, and the flags that are parsed into them.
struct TrainFlags {
  pt::TrainOptions o;
  pt::TrainHooks hooks;  // the launcher's state, test hooks, and the benchmarks' padding and curve
  std::string scheme = "auto", wire = "fp32", hostQueue = "auto";
  bool noOverlap = false;
  int64_t pairBytes = pt::TrainOptions{}.pairBytes;
  int64_t seed = static_cast<int64_t>(pt::TrainOptions{}.seed);
  int maxRestarts = 0;
};

// The model, the optimizer, and how the workers synchronize.
void addTrainingFlags(FlagSet& flags, TrainFlags& t) {
  flags.addString("model", &t.o.model, "lenet (Caffe's, 431K params), cifar10-quick (adapted to 28x28), mlp", "NAME");
  flags.addInt("workers", &t.o.workers, "number of local worker processes", "N", IntRange::closed(1, kMaxRanks));
  flags.addInt("epochs", &t.o.epochs, "epochs to train", "N", IntRange::atLeast(1));
  flags.addInt64("batch", &t.o.batch, "per-worker batch size K", "K", IntRange::closed(1, kMaxBatch));
  flags.addDouble("lr", &t.o.lr,
                  "SGD learning rate (default: 0.025 x min(1, sqrt(workers x batch / 256)): 0.025 for 4 workers x "
                  "batch 64 or more, 0.0125 for one; docs/hyperparameters.md)",
                  "LR", RealRange::above(0));
  flags.addInt64("warmup-steps", &t.o.warmupSteps,
                 "raise the learning rate linearly from LR/N to LR over the first N steps (0: none)", "N",
                 IntRange::atLeast(0));
  flags.addDouble("momentum", &t.o.momentum, "SGD momentum", "M", RealRange::rightOpen(0, 1));
  flags.addDouble("weight-decay", &t.o.weightDecay, "SGD weight decay (L2)", "L", RealRange::rightOpen(0, 1));
  flags.addInt("groups", &t.o.groups,
               "Omnivore's compute groups: G groups of workers, synchronous inside, asynchronous across; the "
               "shards hold the model and run SGD (momentum, weight decay, lr); G must divide --workers (0: off, "
               "plain BSP; docs/omnivore.md)",
               "G", IntRange::closed(0, kMaxRanks));
  flags.addInt64("group-batch", &t.o.groupBatch,
                 "with --groups: each group's batch B, split evenly over its workers/G members (Omnivore's setting: "
                 "every update is the mean gradient of B images whatever G; the default lr is the one for batch B); "
                 "instead of --batch, which is per worker",
                 "B", IntRange::closed(1, kMaxBatch));
  flags.addBool("regroup", &t.o.regroup,
                "with --groups and --checkpoint: resume a checkpoint written with another --groups (the shards' "
                "parameters and momentum carry over; every group starts at its iteration; Omnivore's optimizer, "
                "poseidon tune, changes g so between its epochs)");
  flags.addBool("merged-fc", &t.o.mergedFc,
                "with --groups: Omnivore's merged FC: the FC layers (lenet's and cifar10-quick's ip1, ip2) run on "
                "one FC server (rank 0), model-parallel, with staleness 0; each step a worker sends it its conv "
                "features and gets their gradient back; only the conv layers train in the groups");
  flags.addInt64("staleness", &t.o.staleness,
                 "with --groups: no group runs more than S updates ahead of the slowest (SSP; -1: unbounded)", "S",
                 IntRange::atLeast(-1));
  flags.addInt64("seed", &t.seed, "seed of the initial weights and the per-epoch data order", "S",
                 IntRange::atLeast(0));
  flags.addString("scheme", &t.scheme,
                  "auto (BestScheme per layer), or force ps / sfb / adam (Project Adam's server, the paper's "
                  "baseline) for FC layers",
                  "auto|ps|sfb|adam");
  flags.addString("wire", &t.wire,
                  "what gradients travel as: fp32 (exact), or bf16 / fp16 for PS pairs and SFB factors, summed in "
                  "fp32 (half the bytes; lossy, like DDP's fp16 hook; not with --groups or --plain)",
                  "fp32|bf16|fp16");
  flags.addBool("no-overlap", &t.noOverlap, "sync every layer after the whole backward (the naive baseline)");
  flags.addBool("overlap-forward", &t.o.overlapForward,
                "the overlapped step: each layer's update is applied just before the next forward reaches it, as its "
                "mean gradient lands, instead of after the whole barrier (bit-identical); with --groups the next "
                "round's pull starts as soon as the round's pushes are out and each layer of it is awaited just "
                "before it runs (not with --merged-fc, --drop-stragglers or --plain)");
  flags.addInt("send-window", &t.o.sendWindowBytes,
               "priority-scheduled links, for --overlap-forward: each connection holds BYTES in the kernel and "
               "larger messages go as fragments of it, so a lower layer's result passes the upper ones queued "
               "before it (0: FIFO links; -1: the runtime's default, 1 MB, or 256 KB past 8 peers with --host-queue "
               "tos; else at least 4096; BSP only; docs/scheduling.md)",
               "BYTES", IntRange::closed(-1, 1 << 30));
  flags.addInt("urgent-layers", &t.o.urgentLayers,
               "with --send-window: the round data of the first K layers (the next forward's first) go to each "
               "peer on a second connection marked IP TOS low-delay, behind none of the other layers' bytes in "
               "ZeroMQ and the kernel's send buffers (0: one connection; -1, the default: past 16 peers every layer "
               "below the FC stack with --host-queue tos where the FC layers hold most of the parameters, else 3 "
               "past 8 peers; docs/scheduling.md)",
               "K", IntRange::closed(-1, 1 << 20));
  flags.addString("host-queue", &t.hostQueue,
                  "for the automatic --urgent-layers and --send-window -1: this host's egress queue: tos (two bands, "
                  "the marked one first, as the bench's: past 16 peers the layers below the FC stack go urgent, and "
                  "past 8 peers --send-window -1 is 256 KB), fifo or auto (3 "
                  "layers; auto reads the kernel's qdisc toward the peers and logs it: a NIC's own pfifo_fast is "
                  "unmeasured, docs/scheduling.md)",
                  "auto|fifo|tos");
  flags.addBool("plain", &t.o.plain, "run the plain LibTorch loop without Poseidon (overhead baseline; 1 worker)");
  flags.addString("device", &t.o.device,
                  "where each worker's model and batches live: cpu; cuda (cuda:LOCAL_RANK, one worker per GPU; "
                  "workers beyond the GPUs share them); auto (cuda when LibTorch sees a GPU); docs/gpu.md",
                  "cpu|cuda|auto");
}

// Outputs, checkpoints, restarts, the data and smoke-run limits.
void addRunFlags(FlagSet& flags, TrainFlags& t) {
  flags.addString("summary", &t.o.summaryPath, "write a JSON summary of the run to FILE", "FILE");
  flags.addString("trace", &t.o.tracePath, "write a Chrome trace (chrome://tracing, Perfetto) of every rank to FILE",
                  "FILE");
  flags.addString("checkpoint", &t.o.checkpointDir,
                  "save the job state into DIR (atomically, fsync'd; also where --max-steps stops the job) and "
                  "resume from the newest checkpoint there",
                  "DIR");
  flags.addInt64("checkpoint-every", &t.o.checkpointEvery,
                 "checkpoint every N iterations (0: at the end of every epoch)", "N", IntRange::atLeast(0));
  flags.addInt("max-restarts", &t.maxRestarts,
               "after a failure, restart all workers up to R times, each time on a fresh port, resuming from the "
               "newest checkpoint with --checkpoint (else from iteration 0); a usage error (exit 2) or a diverged "
               "job (exit 3) is not restarted",
               "R", IntRange::atLeast(0));
  flags.addString("data", &t.o.dataDir, "Fashion-MNIST directory (default: /usr/share/datasets/fashion-mnist)", "DIR");
  flags.addInt64("max-steps", &t.o.maxSteps, "stop after N steps in total (smoke tests; -1: no limit)", "N",
                 IntRange::atLeast(1).orOff(-1));
  flags.addBool("allow-divergence", &t.o.allowDivergence,
                "a run whose training diverges (a NaN or an infinity in a mean gradient, checked every step) is a "
                "result, not an error: the job still stops there, but exits 0 and the summary's diverged_at_step "
                "says where (without it every worker exits with code 3 and rank 0 says what to try)");
  flags.addInt64("train-limit", &t.o.trainLimit, "use only the first N training images (-1: all 60000)", "N",
                 IntRange::atLeast(1).orOff(-1));
  flags.addString("save-params", &t.o.saveParamsPath, "write the final parameters as raw float32 to FILE", "FILE");
}

// Threads, timeouts, the network, straggler dropping.
void addRuntimeFlags(FlagSet& flags, TrainFlags& t) {
  flags.addInt("threads", &t.o.threads,
               "LibTorch threads per worker (0: this host's cores / its workers, LOCAL_WORLD_SIZE, else all of "
               "--workers); after the run rank 0 tests --curve-every's "
               "copies with every core",
               "N", IntRange::closed(0, kMaxThreadsPerWorker));
  flags.addInt("sync-threads", &t.o.syncThreads, "Poseidon syncer threads per worker", "N",
               IntRange::closed(1, kMaxThreadsPerWorker));
  flags.addInt("timeout", &t.o.timeoutMs, "timeout of every distributed wait, in milliseconds", "MS",
               IntRange::atLeast(1));
  flags.addInt("tcp-rcvbuf", &t.o.tcpRcvbuf,
               "TCP receive buffer per connection into each rank (0, the default: the send window and a third with "
               "--send-window, seven eighths of it past 8 peers, else the OS's; -1: the "
               "OS's); a small one keeps many senders from overflowing a switch port (incast, docs/bench.md, "
               "docs/scheduling.md)",
               "BYTES", IntRange::closed(-1, 1 << 30));
  flags.addInt("group-push-window", &t.o.groupPushWindow,
               "compute groups: a layer's KV pairs pushed ahead of the replies to the group's updates of them (0, "
               "the default: all at once); keeps each member's pushes at its group's slowest pace, where TCP "
               "sharing one server's link starves some (docs/omnivore.md)",
               "PAIRS", IntRange::closed(0, 1 << 20));
  flags.addInt("io-threads", &t.o.ioThreads,
               "ZeroMQ I/O threads per rank (one per GB/s in or out; with the job secret they also encrypt; 0, the "
               "default: half this host's cores over its ranks (LOCAL_WORLD_SIZE), 2 to 16)",
               "N", IntRange::closed(0, 64));
  flags.addInt("sum-threads", &t.o.sumThreads,
               "threads per rank that sum the pushes its KV shard receives, each pair on one of them, beside the "
               "receive loop (default 2; 0: on the receive loop itself)",
               "N", IntRange::closed(0, 64));
  flags.addString("transport-security", &t.o.transportSecurity,
                  "curve (every connection authenticated with the job secret and encrypted) or none (neither, as Gloo "
                  "and NCCL; only inside a trusted network; rank 0 says so loudly); default: "
                  "POSEIDON_TRANSPORT_SECURITY, else curve",
                  "MODE");
  flags.addInt64("pair-bytes", &t.pairBytes,
                 "KV pair size of the parameter server, the most: on many shards pairs shrink until each shard holds 4 "
                 "of the non-FC layers' (at most 8x, at least 4096; docs/kvstore.md)",
                 "BYTES", IntRange::closed(kMinPairBytes, kMaxPairBytes));
  flags.addInt("local-ranks", &t.o.localRanks,
               "several ranks per machine, as the paper's multi-GPU nodes: ranks r..r+L-1 (r a multiple of L) first "
               "meet on rank r, their leader, which alone synchronizes with the other machines (a machine's PS "
               "update leaves it once, summed; its SF sets go out once, stacked); L must divide --workers; not with "
               "--groups, --drop-stragglers, --servers, --plain or --scheme adam (1, the default: every rank its own "
               "node; 0: one node per host, "
               "found at rendezvous from the ranks' addresses; docs/gpu.md)",
               "L", IntRange::closed(0, 4096));
  flags.addInt("servers", &t.o.servers,
               "only ranks 0..N-1 hold the parameter server's shards, the rest are workers only (--servers 1: the "
               "whole model on rank 0, Omnivore's one model server; 0, the default: every rank holds a shard)",
               "N", IntRange::closed(0, 65536));
  flags.addString("bind", &t.o.bindHost,
                  "interface address for this rank's data endpoint (default: the route to MASTER_ADDR)", "ADDR");
  flags.addInt("drop-stragglers", &t.o.dropStragglers,
               "let each KV pair or SFB round proceed without up to D late workers (0: off)", "D",
               IntRange::closed(0, kMaxDropStragglers));
  flags.addInt64("straggler-timeout", &t.o.stragglerTimeoutMs,
                 "how long a round waits for its last D contributions, in milliseconds; needed with "
                 "--drop-stragglers, which has no default wait",
                 "MS", IntRange::atLeast(0));
}

// The benchmarks' modeled compute and accuracy curve (TrainHooks), and --quiet.
void addBenchAndOutputFlags(FlagSet& flags, TrainFlags& t) {
  flags.addDouble("pad-ms", &t.hooks.padMs,
                  "pad each step's compute (forward + backward, not network waits) to MS milliseconds, a modeled "
                  "device; steps whose real compute took longer are counted and reported (0: off)",
                  "MS", RealRange::closed(0, kMaxPadMs));
  flags.addDouble("pad-forward-share", &t.hooks.padForwardShare,
                  "with --pad-ms and --overlap-forward: the modeled forward's share of the pad, spent layer by layer "
                  "after each layer's update is in (as the real forward's time divides among the layers), so that "
                  "the early layers compute while later ones' updates still come; the rest of the pad goes between "
                  "forward and backward",
                  "F", RealRange::closed(0, 1));
  flags.addDouble("pad-jitter-ms", &t.hooks.padJitterMs,
                  "with --pad-ms: add to each step's pad a wait drawn from an exponential distribution of mean MS "
                  "(per rank, from --seed): varying step times, as stragglers make them",
                  "MS", RealRange::closed(0, kMaxPadMs));
  flags.addInt64("curve-every", &t.hooks.curveEvery,
                 "rank 0 keeps its model every N steps and, after the run, tests each copy on the whole test set: "
                 "the accuracy curve against the training clock, in the summary (0: off)",
                 "N", IntRange::atLeast(0));
  flags.addInt64("curve-loss-samples", &t.hooks.curveLossSamples,
                 "with --curve-every: also score each copy by its mean loss on N fixed training images (evenly "
                 "spaced), after the run: the curve's sample_loss, poseidon tune's probe signal (0: off)",
                 "N", IntRange::atLeast(0));
  flags.addBool("quiet", &t.o.quiet, "no progress lines");
}

// After parsing: the flags' values into the options, and the checks that need several of them.
void finishOptions(TrainFlags& t) {
  pt::TrainOptions& o = t.o;
  o.scheme = parseSchemePolicy(t.scheme);
  o.wire = parseWirePrecision(t.wire);
  o.hostQueue = parseEgressQueue(t.hostQueue);
  // The queue decides what is automatic: the urgent layers (-1) and the send window (-1).
  if (o.hostQueue != EgressQueue::kAuto &&
      (o.sendWindowBytes == 0 || (o.urgentLayers != -1 && o.sendWindowBytes != VanOptions::kAutoSendWindow))) {
    throw InvalidArgument(strCat("--host-queue ", t.hostQueue,
                                 " chooses the automatic urgent layers and send window: it needs --send-window, and "
                                 "no --urgent-layers unless --send-window -1"));
  }
  if (o.wire != WirePrecision::kFp32 && o.plain) {
    throw InvalidArgument(strCat("--wire ", t.wire, " and --plain cannot be combined (--plain sends nothing)"));
  }
  if (o.wire != WirePrecision::kFp32 && o.groups > 0) {
    throw InvalidArgument(strCat("--wire ", t.wire,
                                 " and --groups cannot be combined (the groups' pulls carry the "
                                 "model itself)"));
  }
  pt::checkDevice(o.device);
  o.overlap = !t.noOverlap;
  o.seed = static_cast<uint64_t>(t.seed);
  o.pairBytes = t.pairBytes;
  if (o.dropStragglers > 0 && o.stragglerTimeoutMs <= 0) {
    throw InvalidArgument("--drop-stragglers needs --straggler-timeout MS (how long to wait for late workers)");
  }
  if (o.localRanks > 1) {
    if (o.workers % o.localRanks != 0) {
      throw InvalidArgument(strCat("--local-ranks ", o.localRanks, " must divide --workers ", o.workers));
    }
    const char* other = o.groups > 0           ? "--groups"
                        : o.dropStragglers > 0 ? "--drop-stragglers"
                        : o.servers > 0        ? "--servers"
                        : o.plain              ? "--plain"
                                               : nullptr;
    if (other) throw InvalidArgument(strCat("--local-ranks ", o.localRanks, " cannot be combined with ", other));
  }
  readReliabilityEnvironment(t.hooks);
  o.secret = jobSecretFromEnvironment();
  if (!o.transportSecurity.empty()) parseTransportSecurity(o.transportSecurity, "--transport-security");
  // Every rank reads POSEIDON_TRANSPORT_SECURITY before the flag replaces it: a bad value once, here.
  transportSecurityFromEnvironment();
}

// Merges the per-rank trace files into --trace.
void mergeTraces(const std::string& tracePath, int ranks) {
  std::vector<std::string> parts;
  for (int i = 0; i < ranks; ++i) parts.push_back(tracePath + ".rank" + std::to_string(i));
  Tracer::merge(parts, tracePath);
  for (const auto& p : parts) std::filesystem::remove(p);
}

// Flags that only act together with another one: refused alone, not silently ignored.
void refuseUnpairedFlags(const FlagSet& flags, const TrainFlags& t) {
  struct Needs {
    const char* flag;
    bool missing;
    const char* other;
  };
  const Needs needs[] = {
      {"checkpoint-every", t.o.checkpointDir.empty(), "--checkpoint DIR"},
      {"straggler-timeout", t.o.dropStragglers <= 0, "--drop-stragglers D"},
      {"group-push-window", t.o.groups <= 0, "--groups G"},
      {"pad-forward-share", t.hooks.padMs <= 0 || !t.o.overlapForward, "--pad-ms MS and --overlap-forward"},
  };
  for (const Needs& n : needs) {
    if (flags.wasSet(n.flag) && n.missing)
      throw InvalidArgument(strCat("--", n.flag, " needs ", n.other, "; without it the flag would change nothing"));
  }
  if (t.hooks.curveEvery > 0 && t.o.maxSteps > 0 && t.hooks.curveEvery > t.o.maxSteps) {
    throw InvalidArgument(strCat("--curve-every ", t.hooks.curveEvery, " is past the run's --max-steps ", t.o.maxSteps,
                                 ": the curve would have no point"));
  }
}

// --workers local processes, each running this command as one rank; restarted up to --max-restarts.
int launchWorkers(const TrainFlags& t, const std::vector<std::string>& args) {
  const pt::TrainOptions& o = t.o;
  // A missing or damaged dataset is reported once, here, rather than by every worker (a rank started
  // on its own finds out when it loads the data): both splits, as each worker loads both.
  for (const bool trainSplit : {false, true}) {
    (void)data::loadFashionMnist(o.dataDir.empty() ? data::kDefaultFashionMnistDir : o.dataDir, trainSplit);
  }
  LaunchOptions lo;
  lo.ranks = o.workers;
  lo.command = {selfExecutable(), "train"};
  // The workers get the command's flags but --max-restarts, which is this launcher's: a rank refuses it.
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--max-restarts") ++i;
    else if (args[i].rfind("--max-restarts=", 0) != 0) lo.command.push_back(args[i]);
  }
  lo.prefixRank0 = false;
  lo.maxRestarts = t.maxRestarts;
  lo.name = kOwnLauncher;
  lo.finishedCodes = {pt::kExitDiverged};  // every rank stops at the same step and says so itself
  LaunchResult r = launchLocal(lo);
  if (r.exitCode == pt::kExitDiverged) return r.exitCode;  // rank 0 said where and what to try
  if (r.exitCode != 0) {
    std::cerr << "poseidon train: " << r.failure << (r.interrupted ? "" : "; stopped the other workers") << "\n";
    return r.exitCode;
  }
  if (!o.tracePath.empty()) {
    mergeTraces(o.tracePath, o.workers);
    std::cout << "trace written to " << o.tracePath << " (open in chrome://tracing or ui.perfetto.dev)\n";
  }
  if (!o.summaryPath.empty()) std::cout << "summary written to " << o.summaryPath << "\n";
  return 0;
}

}  // namespace

int trainCommand(const std::vector<std::string>& args) {
  TrainFlags t;
  FlagSet flags("train", "poseidon train [flags]",
                "Trains a CNN on Fashion-MNIST with Poseidon: one process per worker, each reading its own shard of\n"
                "the training set (reshuffled every epoch from --seed), gradients synchronized every step by\n"
                "wait-free backprop + hybrid PS/SFB communication. Prints the per-layer plan, progress, test\n"
                "accuracy after each epoch, and bytes on the wire by scheme against the Table 1 prediction.\n"
                "Without RANK in the environment it starts --workers local processes itself; started by\n"
                "'poseidon launch', torchrun-style variables, mpirun or Slurm, it runs as that one rank.");
  addTrainingFlags(flags, t);
  addRunFlags(flags, t);
  addRuntimeFlags(flags, t);
  addBenchAndOutputFlags(flags, t);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  if (flags.wasSet("batch") && flags.wasSet("group-batch")) {
    throw InvalidArgument("--batch is per worker and --group-batch per compute group: give one of them");
  }
  finishOptions(t);
  refuseUnpairedFlags(flags, t);
  const pt::TrainOptions& o = t.o;
  RankEnv env = rankFromEnvironment();
  if (env.present && flags.wasSet("workers") && o.workers != env.worldSize) {
    throw InvalidArgument(strCat("--workers ", o.workers, " disagrees with the launcher's world size ", env.worldSize,
                                 " (", env.source, ": ", env.origin, ")"));
  }
  // "--timeout 30" meant as seconds gives up every wait after 30 ms, and the rendezvous then fails with
  // a timeout that looks like a network problem: said once, up front (by rank 0, unless this train
  // started it and said it already).
  if (o.timeoutMs < 1000 && (!env.present || (env.rank == 0 && env.source != kOwnLauncher))) {
    std::cerr << "poseidon train: warning: --timeout " << o.timeoutMs
              << " is in milliseconds: every distributed wait gives up after " << o.timeoutMs / 1000.0 << " s\n";
  }
  // Restarts are the launcher's: a rank cannot restart itself (poseidon train strips the flag from
  // the workers it starts).
  if (env.present && flags.wasSet("max-restarts")) {
    throw InvalidArgument(strCat("--max-restarts is for a train that starts its own workers; started by ", env.source,
                                 " (", env.origin, ")",
                                 ", give the restarts to that launcher (poseidon launch --max-restarts R)"));
  }
  // Started as one rank by a launcher: the rank checks its options itself (trainRank).
  if (env.present) return pt::trainRank(o, t.hooks, env);
  // Starting the workers itself: their options' errors once, before any worker starts.
  pt::validateTrainOptions(o, t.hooks, o.workers);
  // And the output paths and --bind: one line here rather than each rank's and the launcher's echo.
  pt::checkOutputPaths(o, 0);
  if (!o.bindHost.empty()) {
    if (const std::string why = Van::bindHostError(o.bindHost); !why.empty()) {
      throw InvalidArgument(strCat("--bind ", o.bindHost, ": the workers cannot listen there (", why,
                                   "); it must be an address or interface of this machine"));
    }
  }
  // A world of one on a free port (DistributedOptions::fromEnvironment), in this process; with
  // --max-restarts it is a child of the launcher like any other world, so that it can be restarted.
  if (o.workers == 1 && t.maxRestarts == 0) {
    int rc = pt::trainRank(o, t.hooks, env);
    if (rc == 0 && !o.tracePath.empty()) mergeTraces(o.tracePath, 1);
    return rc;
  }
  return launchWorkers(t, args);
}

}  // namespace poseidon::cli
