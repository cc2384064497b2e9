// The planner: a discrete-event model of training iterations on a cluster of
// any size, for Poseidon's systems and for an allreduce model of PyTorch DDP
// (docs/planner.md). It answers what a user with P machines and a given link
// would see, without running anything, and it is checked against the
// emulated cluster's measurements (`poseidon plan --check RESULTS.json`).
//
// What one iteration is made of, per node (every node is a worker and a
// server shard, as in the bench and `poseidon train`):
//   compute   the forward layer by layer, then the backward from the top;
//             each layer's time is its share of the model's single-GPU
//             iteration (bench/emulation.h's split, or a user's total);
//   WFBP      layer l's sync is issued the moment its backward is done
//             (ps-naive: all of them after the whole backward);
//   PS        each 2 MB pair of the layer is pushed to the shard that holds
//             it (core/kv_layout.h), summed there when every worker's push is
//             in, and the sum sent back to every worker;
//   SFB       each worker sends its factors (K x (M + N) floats) to every
//             peer, and rebuilds the gradient (a K P x M x N GEMM) once all
//             are in;
//   links     each node has one egress and one ingress of the same rate; a
//             message is encrypted (CURVE, on the sender's I/O thread), takes
//             its turn on the sender's egress, streams into the receiver's
//             ingress (cut-through: both ends serve it at once when both are
//             free) and is decrypted on the receiver's I/O thread (with two,
//             as by default, one encrypts every send and one every receive);
//             egress is FIFO, or by layer priority in fragments of the send
//             window for poseidon-overlap;
//   BSP       a worker starts its next forward when all its layers are
//             synchronized (poseidon-overlap: layer l's forward starts when
//             layer l is);
//   copies    on a GPU node (Cluster::copyBytes > 0) each layer's gradient (a
//             PS layer's, or an SFB layer's factors) goes to host memory on
//             the copy engine before its sync, and the result comes back in
//             the GPU's stream before the layer counts as synchronized (an
//             SFB layer's P factors before its reconstruction);
//   DDP       gradients go in buckets (1 MB first, then 25 MB, in backward
//             order); each bucket is ring-allreduced (2 (P-1)/P of its bytes
//             over each link, 2 (P-1) steps) once its last gradient is ready,
//             one bucket at a time (ddp-fp16: 2 bytes a float).
// Several iterations are simulated (four, the overlap six) and the steady state's period reported:
// the mean of the last two (four).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "poseidon/core/kv_layout.h"
#include "poseidon/model/layer.h"
#include "poseidon/wire/precision.h"

namespace poseidon::planner {

enum class System : uint8_t { kPoseidon = 0, kPoseidonOverlap, kPsWfbp, kPsNaive, kDdp, kDdpFp16 };
// "poseidon", "poseidon-overlap", "ps-wfbp", "ps-naive", "ddp", "ddp-fp16" (its fp16 compression hook: half the bytes)
const char* systemName(System s);
System parseSystem(const std::string& text);  // throws InvalidArgument naming the known ones
const std::vector<System>& allSystems();

// A model and one worker's compute per layer.
struct Workload {
  ModelDesc model;
  int64_t batch = 0;                                    // per worker, K
  std::vector<double> forwardSeconds, backwardSeconds;  // per layer, in forward order
  // The SFB GEMM's FLOPs at full width per FLOP of this workload: 1 / s^3 at width scale s, times the
  // published batch over the rounded one (the bench charges that, bench-worker's device model).
  double flopScale = 1.0;
  double computeSeconds() const;
};

// The bench's emulated models (bench/emulation.h: vgg19, vgg19-22k, googlenet, inception-v3,
// resnet-152, alexnet) at width scale s on `compute` (titanx, h200, h200-bf16): the same shapes,
// batch and per-layer times the bench uses, at the width where the batch is whole
// (bench::wholeBatchScale; wholeBatch = false: at s with the batch rounded, as older results files).
Workload zooWorkload(const std::string& name, double scale = 1.0, const std::string& compute = "titanx",
                     bool wholeBatch = true);
// Any layer table with a single-worker iteration time: split 1/3 forward, 2/3 backward and over
// the layers by their MACs per sample (evenly where the table gives none), as the bench does.
Workload workloadFor(ModelDesc model, int64_t batch, double iterationSeconds);
// A step whose compute is padded to `seconds` before the backward, so that every sync starts after
// it (`poseidon train --pad-ms`, the time-to-accuracy mode): all of it in the forward.
Workload paddedWorkload(ModelDesc model, int64_t batch, double seconds);

// Calibrated on the emulated cluster (docs/planner.md):
//  - what TCP/IP and the ACKs add to each payload byte on a link (the bench's interface counters
//    read 1.02-1.06x the payload: 66 bytes of headers per 1448-byte segment);
//  - the receive loop's own time per message besides decryption (ZeroMQ, the copies, the
//    dispatch): 30 us, the most one node's whole rank spends per message (resnet-152 alone on an
//    emulated H200 node: 18-19 ms of CPU for 622 messages an iteration), which the one run of the
//    h200 tables that depends on it fits (30-45 us); 60 us was fitted on resnet-152's many small
//    pairs while each of the bench's charged sleeps woke 70-75 us late (kernel's default timer
//    slack), and `plan --check` keeps it for the files made then (no timer_slack_ns recorded);
//  - what one step of DDP's ring costs besides its bytes (none needed so far);
//  - the servers' sums: one core of this machine (bench/device.h measures it).
constexpr double kLinkOverhead = 1.045;
constexpr double kMessageSeconds = 30e-6;
constexpr double kMessageSecondsDefaultSlack = 60e-6;  // bench files before 2026-11-30 (see above)
constexpr double kDdpStepSeconds = 0;
constexpr double kSumBytesPerSecond = 22.5e9;
// The emulated cluster itself, as `poseidon plan --check` models it: its tbf links give TCP 92% of
// their nominal rate (fitted on DDP's ring at 2-16 nodes and 30-100 Mbit/s), and its P nodes share
// the host's cores, so a message's loop time stretches by P / cores.
constexpr double kEmulatedLinkEfficiency = 0.92;
// An H200's host <-> device copies from pinned memory, each way (../shared/data/README.md).
constexpr double kH200PinnedCopyBytes = 55e9;

struct Cluster {
  int workers = 8;  // P: nodes
  // GPUs (ranks) per node (poseidon train --local-ranks): they meet on the node's first rank before
  // the network, whose traffic is then one worker's of their L x K rows (PS: the node's mean; SFB: its
  // stacked factors). The local step goes over the loopback: each member's push encrypted on its own
  // I/O thread, decrypted on the leader's and added on its receive loop; the result back to each
  // member encrypted on the leader's. The members compute beside the leader, as fast. DDP's ring
  // runs over all P x L ranks, one hop of it on each node's link.
  int localRanks = 1;
  // The KV shards live on nodes 0..servers-1 only (poseidon train --servers; 1 is Omnivore's one model
  // server; plan offers it with --groups); 0: on every node.
  int servers = 0;
  double scale = 1.0;                   // the workload's width scale: the device rates below are full width
  double linkBytes = 0;                 // each node's link, each way, bytes/s, at the workload's scale
  double linkOverhead = kLinkOverhead;  // bytes on the link per payload byte (TCP/IP headers, ACKs)
  double messageBytes = 48;             // bytes on the link per message besides its payload (frame header)
  // The runtime's own work at full width (bench/device.h charges it in the bench); 0: free.
  double cryptoBytes = 1.75e9;           // CURVE, bytes/s per I/O thread (0: links without encryption)
  int cryptoLanes = 2;                   // I/O threads per process (NodeOptions::ioThreads)
  double gemmFlops = 5e12;               // SFB reconstruction; a Titan X by default
  // The reconstruction runs on the GPU that computes the layers, in its one stream (the bench's
  // timeline, bench/device.h), rather than on host cores beside it.
  bool gemmOnGpu = true;
  // On the GPU, an iteration's reconstructions wait until the node's backward is done, as the runtime
  // holds them (NodeOptions::deferReconstruction); false: each as its factors land, inside the backward
  // (--check of files made before 2026-12-02, or with bench --defer-reconstruction=false).
  bool deferReconstruction = true;
  double sumBytes = kSumBytesPerSecond;  // a shard's decode-and-add of each push
  // The shard's sum threads (NodeOptions::sumThreads): each pair's pushes summed on one of them, beside
  // the receive loop; 0: on the loop (the runtime before 2026-11-30, and --check of older files).
  int sumLanes = kDefaultSumThreads;
  // Host <-> GPU copies, bytes/s each way (pinned memory, as the runtime stages: an H200 measured 55 GB/s,
  // pageable 6.8 / 13.6; ../shared/data); 0: none (the bench's emulated GPUs hold their tensors on the host).
  double copyBytes = 0;
  bool timedSchemes = true;  // BestScheme weighs GEMM against bytes (it does where the rates are known)
  WirePrecision wire = WirePrecision::kFp32;
  int64_t pairBytes = kDefaultPairBytes;  // at full width; scaled by s^2 as the bench does
  // poseidon-overlap's fragments (the send window), full width; 0: the runtime's default for this
  // cluster's peers and queue (Van::defaultSendWindow under sendWindowRule; sendWindowFor()).
  double sendWindowBytes = 0;
  int sendWindowRule = 2;  // Van::kSendWindowRule (checked in poseidon_model.cc); --check reads the file's
  // poseidon-overlap: the layers whose round data take a second connection per peer (VanOptions::urgentLayers;
  // -1: the runtime's rule, Van::urgentLayerCount: past 16 peers the layers below the FC stack with
  // hostQueueTold (rule 3: lowDelayFirst), past 8 peers 3; 0: none). On a node's egress that connection takes its turns
  // beside the bulk ones, with its own few fragments committed.
  int urgentLayers = -1;
  // Which of the runtime's rules -1 meant (VanOptions::kAutoUrgentRule; --check reads the bench
  // file's urgent_rule).
  int urgentRule = 4;  // VanOptions::kAutoUrgentRule (checked in poseidon_model.cc)
  // Each node's egress queue serves its urgent connections' packets (TOS low-delay) before the
  // others, as Linux's pfifo_fast does (bench --host-queue tos or pfifo_fast); false: the connections
  // take turns.
  bool lowDelayFirst = false;
  // The ranks are told their queue is two-band (train --host-queue tos; the bench tells its ranks
  // so with --host-queue tos): since urgentRule 4 only then does the rule take the layers below the
  // FC stack (rule 3 took them wherever lowDelayFirst, read or told).
  bool hostQueueTold = false;
  // The switch ports toward each node serve those packets first too (switches set to trust the
  // DSCP mark; plan --switch-queue tos, a design study: the bench's switch ports are FIFO).
  bool switchLowDelayFirst = false;
  // How poseidon-overlap's round data share the links (plan --links; a design study: the runtime runs
  // kAsBuilt):
  //  - kAsBuilt: each node's connections take turns on its egress, a few fragments each committed
  //    (the priority scheduler's window), and its ingress takes what arrives in arrival order;
  //  - kCredits: receiver-driven credits: each node grants its senders room for one fragment at a
  //    time, the most urgent requested fragment first, with at most creditWindowBytes granted and
  //    not yet arrived; a grant reaches its sender one fragment's time later (it may wait behind one
  //    on the receiver's egress); the sender sends its most urgent granted fragment next;
  //  - kIdeal: each node's egress sends, and its ingress takes, the most urgent fragment of any
  //    connection first, with no grants to wait for: the floor any scheduling of these links can
  //    reach with this protocol.
  // Outside kAsBuilt, messages of one layer and iteration go in a rotated order (to peer src + 1
  // first, src + 2 next, ...), so that no rank is always served last.
  enum class Links : uint8_t { kAsBuilt = 0, kCredits, kIdeal };
  Links links = Links::kAsBuilt;
  // kCredits: a receiver's granted bytes in flight, full width; 16 MB (45 ms at 3 Gbit/s) is the best of
  // 2-32 MB for vgg19 at 32 nodes and 3 Gbit/s (docs/planner.md, "Scheduling the links")
  double creditWindowBytes = 16 * 1048576.0;
  double ddpBucketBytes = 25 * 1048576.0;   // full width
  double ddpFirstBucketBytes = 1048576.0;   // full width
  double ddpStepSeconds = kDdpStepSeconds;  // per ring step: latency and Gloo's bookkeeping
  double messageSeconds = kMessageSeconds;  // the receive loop's own time per message, decryption aside
};

// poseidon-overlap's send window at full width: Cluster::sendWindowBytes, or where it is 0 the runtime's
// default for the cluster's peers and the queue its nodes are told (Van::defaultSendWindow).
double sendWindowFor(const Cluster& c);

// "as-built", "credits", "ideal" (plan --links); parseLinks throws InvalidArgument naming them and the flag.
const char* linksName(Cluster::Links links);
Cluster::Links parseLinks(const std::string& text);

// `calibration` as the emulated cluster runs it: `workers` nodes on one host of `hostCores` cores,
// links of `mbit` Mbit/s (nominal, at the workload's scale).
Cluster emulatedCluster(const Cluster& calibration, int workers, double mbit, int hostCores);

struct Prediction {
  System system = System::kPoseidon;
  int workers = 0;
  double iterationSeconds = 0;  // the steady state's period
  double computeSeconds = 0;    // one worker's forward + backward
  double speedup = 0;           // P x compute / iteration (the bench's: throughput over one node's)
  double efficiency = 0;        // speedup / P
  double maxNodeTxBytes = 0;    // the busiest node's bytes on its egress per iteration, overhead included
  double boundSeconds = 0;      // max(compute, maxNodeTxBytes / linkBytes): the system's own bound
  int sfbLayers = 0;
};

// Throws InvalidArgument for a cluster it cannot model (no workers, no link rate with P > 1).
Prediction predict(const Workload& workload, const Cluster& cluster, System system);

// Omnivore's compute groups (`poseidon train --groups g`): the planner's hardware-efficiency
// model HE(g). A step is one worker's round (pull the model, compute, push its gradient); each
// group's k = P / g members make one update of the shared model per round, and the g groups run
// asynchronously, so the model is updated every stepSeconds / g (Omnivore's time per iteration).
struct GroupPrediction {
  int groups = 0, groupSize = 0;  // g, k
  double stepSeconds = 0;         // one worker's round in the steady state (mean over workers)
  double updateSeconds = 0;       // between updates of the shared model (stepSeconds / g when groups step alike)
  double samplesPerSecond = 0;    // through all workers: the sum of batch / step
  double computeSeconds = 0;      // one worker's forward + backward
  double maxNodeTxBytes = 0;      // the busiest node's bytes on its egress per round, overhead included
  double fcServerBusy = 0;        // merged FC: the share of the time the FC server computes (1: saturated)
};
// Merged FC (`poseidon train --merged-fc`, Omnivore's Fig. 5a): the model's top FC layers run on one
// FC server (node 0), model-parallel. Each round a member sends it its activations (batch x
// activationFloats each way) after its forward of the layers left on the workers; the server serves
// one group round at a time (k x batch x serverSecondsPerSample: Omnivore's t_fc) and sends each
// member its gradient, and the member's backward starts then.
struct MergedFc {
  double activationFloats = 0;        // per sample: the first FC layer's input width
  double serverSecondsPerSample = 0;  // the FC layers' forward + backward on the server, per sample
};
// Splits off the top FC layers (the longest run of FC layers that ends the model; InvalidArgument
// when there is none, or nothing before it): the workers keep the rest of the workload, and the
// server computes the FC layers at the workers' speed.
std::pair<Workload, MergedFc> splitMergedFc(const Workload& workload);
// A padded step (paddedWorkload) with merged FC: the pad is the compute of the layers left on the
// workers (`poseidon train --merged-fc --pad-ms`); the server's time per sample is the caller's.
std::pair<Workload, MergedFc> paddedMergedFc(const ModelDesc& model, int64_t batch, double seconds,
                                             double serverSecondsPerSample);
// Throws InvalidArgument when g does not divide the workers (or predict()'s reasons). With
// `mergedFc`, the workload is the part left on the workers (splitMergedFc's first).
GroupPrediction predictGroups(const Workload& workload, const Cluster& cluster, int groups,
                              const MergedFc* mergedFc = nullptr);

// The runtime's own CPU- and copy-side costs, each of which the planner can leave out.
enum class Cost : uint8_t { kCrypto = 0, kCopies, kMessages, kSums, kGemm };
const char* costName(Cost c);  // "CURVE encryption", "host copies", ...
const std::vector<Cost>& allCosts();
// Whether `cluster` charges `cost` at all, and the cluster without it (its time 0).
bool charges(const Cluster& cluster, Cost cost);
Cluster withoutCost(Cluster cluster, Cost cost);
// The lowest link rate (bytes/s at the workload's scale, between `lo` and `hi`) from which leaving
// `cost` out makes `system`'s iteration at least `margin` faster: where that cost, not the link or
// the compute, starts to set the pace. 0 when it does at `lo` already, infinity when not even at
// `hi` or where the cluster does not charge it. Bisection on predict(), to 1%.
double costBindsFrom(const Workload& workload, Cluster cluster, System system, Cost cost, double margin, double lo,
                     double hi);

// The lowest link rate (bytes/s at the workload's scale) at which `system` reaches `efficiency`
// (bisection on predict(), to 0.5%, from a bracket around the cluster's own rate); 0 when it does at any
// rate (P = 1), infinity when at none. Near
// that rate the efficiency is not monotone (each rate shifts the discrete events), so a rate a
// percent or two lower may reach it too: the answer is the lowest to within a few percent.
double minLinkBytesFor(const Workload& workload, Cluster cluster, System system, double efficiency);

}  // namespace poseidon::planner
