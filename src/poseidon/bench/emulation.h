// Trace-driven compute emulation for the emulated-cluster benchmark
// (DESIGN.md section 4). Every layer keeps its real parameter shapes (at a
// width scale s), while its forward and backward kernels become waits of the
// time that layer takes on the modelled GPU (`--compute`):
//   titanx     the paper's GPU: the model's published single-GPU iteration
//              time, split 1/3 forward, 2/3 backward, and over the layers in
//              proportion to their multiply-accumulates at full width;
//   h200       measured on an NVIDIA H200 (bench/data/README.md), fp32, layer
//              by layer (googlenet: its measured forward and backward totals
//              split by MACs, as torchvision's GoogLeNet is not the zoo's);
//   h200-bf16  the same in bf16 autocast.
//
// Scaling rule (keeps every ratio of the paper): widths x s, per-worker batch
// x s, link rate x s^2, compute time unchanged. A batch is whole samples, so a
// model whose batch K x s is not whole runs at the nearest width s' that makes it
// whole and at least one row, s' = max(1, round(K s)) / K (wholeBatchScale: vgg19's
// K = 32 at s = 0.1 runs at
// 0.09375, 3 rows a worker), and its links at rate x (s'/s)^2 (emulatedMbit): the
// same full-width rate, and SFB's factors (K s' (M + N) s' floats) carry exactly s'^2
// of full width's bytes, like every other message. Rounding K s to 3 at s = 0.1 left
// them 6% light before.
#pragma once

#include <string>
#include <vector>

#include "poseidon/model/layer.h"
#include "poseidon/wire/precision.h"

namespace poseidon::bench {

struct EmulatedModel {
  std::string name;
  double scale = 0.1;             // the width it runs at: wholeBatchScale of the one asked for
  ModelDesc desc;                 // scaled parameter shapes
  int64_t batch = 0;              // published per-worker batch x scale (whole), at least 1
  int64_t fullBatch = 0;          // the published per-worker batch
  double iterationSeconds = 0;    // single-GPU seconds per iteration
  std::string timeSource;         // where iterationSeconds comes from
  std::vector<double> forwardSeconds, backwardSeconds;  // per layer
  double computeSeconds() const;  // sum of all waits
};

// Time dilation (bench --time-dilation F; the time-dilation factor of Gupta et al., "To Infinity and
// Beyond: Time-Warped Network Emulation", NSDI'06): every emulated duration is F times longer (each
// layer's compute, the charged work, the links at rate / F with F times their queueing time, so the
// same bytes queue) and every reported time is divided by F. What is not dilated is this host's own
// work per message and byte (the kernel's, ZeroMQ's): each emulated node gets F times the CPU per
// emulated second, as on a host with F times faster cores. Nor are the kernel's TCP timers but the
// minimum retransmission timeout (set per route to F x 200 ms): delayed ACKs come up to F times
// sooner in emulated time.
// 32: on the 2-core machine, 32 nodes at F = 32 get 2 cores each per emulated second, what F = 4 gives
// them on a 16-core machine. Past it the kernel's delayed ACK (40 ms) comes within ~1 ms of emulated time.
constexpr double kMaxTimeDilation = 32;
// Makes every compute wait of `m` f times longer.
void dilate(EmulatedModel& m, double f);

// The GPUs whose compute is tabled: titanx, h200, h200-bf16.
const std::vector<std::string>& computeNames();
bool isComputeName(const std::string& name);

// Models with a known single-GPU time: vgg19, vgg19-22k, googlenet,
// inception-v3, resnet-152, alexnet, on `compute` (computeNames()), at width
// wholeBatchScale(name, scale). wholeBatch = false: at `scale` itself with the batch
// rounded (how results files without "model_scales" were made; plan --check reads
// them so). Throws InvalidArgument for an unknown model or compute.
EmulatedModel emulatedModel(const std::string& name, double scale, const std::string& compute = "titanx",
                            bool wholeBatch = true);
// The width at which the model's published batch K times it is whole: max(1, round(K s)) / K
// (s itself at full width, or where K s is whole).
double wholeBatchScale(const std::string& name, double scale);
// The link rate a model at `width` (EmulatedModel::scale) runs at for the rate `mbit` at width
// `scale` (rate / scale^2 at full width): mbit x (width / scale)^2.
double emulatedMbit(double width, double mbit, double scale);
const std::vector<std::string>& emulatedModelNames();

// The fp32 rate of the SFB reconstruction GEMM on the H200 (the median of the
// measured shapes, bench/data/README.md).
double h200SfbGemmFlops();

// The layer table with per-layer waits, for bench/ddp_worker.py:
// {"name", "batch", "layers": [{"name", "params": [[shape], ...], "forward_s", "backward_s"}]}
std::string emulatedModelJson(const EmulatedModel& m);

}  // namespace poseidon::bench
