// The modelled node of `poseidon bench --compute` (common/work_charger.h says
// what is charged and where). This machine's own rates are measured once at
// the start of a bench run; the modelled node is then
//   titanx     the paper's GPU: its compute tables (bench/emulation.h) and its
//              reconstruction GEMM (Maxwell: 5 TFLOP/s of sustained SGEMM,
//              about 75% of its 6.6 TFLOP/s peak); the servers' sums and CURVE
//              encryption stay on the host CPU at this machine's measured
//              one-core rates;
//   h200, h200-bf16  an H200: its measured compute tables and reconstruction
//              GEMM (fp32, measured), sums and encryption as above;
//   cpu:C      the list's GPU computes, the GEMM runs on C cores of this
//              machine (its measured one-core rate times C), sums and
//              encryption as above;
//   none       the list's GPU computes, nothing charged (the work costs its
//              real time at width s).
// On a GPU node the reconstruction shares the emulated GPU's timeline with the
// forward and backward (one stream: it delays the layers after it); on cpu:C
// the C cores do one reconstruction at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "poseidon/common/device_model.h"
#include "poseidon/common/work_charger.h"

namespace poseidon::bench {

struct MachineRates {
  double gemmFlops = 0;    // one core: the reconstruction GEMM (Eigen), m = n = 1024, K = 256
  double sumBytes = 0;     // one core: a shard's decode-and-add of a 2 MB pair (accumulateContribution)
  double cryptoBytes = 0;  // one core: XSalsa20-Poly1305 (libsodium crypto_secretbox) over 2 MB
};

constexpr double kTitanXGemmFlops = 5e12;

// About a second of measuring; best of a few tries each.
MachineRates measureMachineRates();

// Throws InvalidArgument for a spec other than titanx, h200, h200-bf16, cpu:C (C in [1, 256]), none.
DeviceModel deviceFor(const std::string& spec, double scale, const MachineRates& rates);

// --compute's list, checked: the GPU whose compute tables every system runs on
// (the list's one GPU name, titanx if it names none) and the nodes on which
// Poseidon's own work is charged, in order. Throws InvalidArgument for an
// empty list, an unknown or repeated name, or two different GPUs.
struct ComputeChoice {
  std::string gpu;
  std::vector<std::string> nodes;
};
ComputeChoice parseComputeList(const std::string& list);

// The I/O threads' timelines behind ChargedDevice::admitCrypto: a message on
// `connection` starts when its lane (connection mod lanes) is free, or now, and
// ends `cost` later.
class CryptoLanes {
 public:
  explicit CryptoLanes(int lanes) : busy_(static_cast<size_t>(lanes < 1 ? 1 : lanes)) {}
  int lanes() const { return static_cast<int>(busy_.size()); }
  WorkClock::time_point admit(WorkClock::time_point now, WorkClock::duration cost, int connection) {
    auto& busy = busy_[static_cast<size_t>(connection < 0 ? 0 : connection) % busy_.size()];
    busy = (busy > now ? busy : now) + cost;
    return busy;
  }

 private:
  std::vector<WorkClock::time_point> busy_;
};

// One in-order timeline: the emulated GPU's stream (its layers and, on a GPU
// node, the reconstruction), or the C cores of a cpu:C node (one
// reconstruction at a time). Work that starts at `start` begins when the
// timeline is free and ends `cost` later.
class DeviceTimeline {
 public:
  WorkClock::time_point admit(WorkClock::time_point start, WorkClock::duration cost) {
    busy_ = std::max(busy_, start) + cost;
    return busy_;
  }

 private:
  WorkClock::time_point busy_{};
};

// Seconds charged so far, real time included, per kind.
struct ChargedSeconds {
  double gemm = 0, sum = 0, crypto = 0;
};

// The bench rank's charger: the runtime's own work on the modelled node, one
// per process (its I/O threads' lanes are the process's). Thread-safe.
class ChargedDevice final : public WorkCharger {
 public:
  explicit ChargedDevice(DeviceModel model) : model_(std::move(model)), lanes_(model_.cryptoLanes) {}

  const DeviceModel& model() const override { return model_; }
  void chargeGemm(double scaledFlops, WorkClock::time_point start) override;
  void chargeSum(double scaledBytes, WorkClock::time_point start) override;
  bool chargesCrypto() const override { return model_.cryptoBytes > 0; }
  WorkClock::time_point admitCrypto(double scaledBytes, int connection) override;
  // Holds the caller until admitCrypto's time.
  void chargeCrypto(double scaledBytes, int connection);
  // The emulated GPU computing for `cost` from `start` (bench-worker's layers): when the GPU's
  // timeline is free, so a reconstruction charged on the GPU delays the layers after it. Returns
  // the end, without waiting.
  WorkClock::time_point compute(WorkClock::time_point start, WorkClock::duration cost);

  ChargedSeconds charged() const;

  // A sum's wait shorter than this is owed by its thread and slept with the next one that reaches it
  // (hold): one wake-up for many short sums.
  static constexpr WorkClock::duration kMinHoldWait = std::chrono::microseconds(200);

 private:
  // Holds the caller until `seconds` after `start`, the waits below kMinHoldWait gathered per thread.
  void hold(double seconds, WorkClock::time_point start, std::atomic<int64_t>& tally);

  const DeviceModel model_;
  std::atomic<int64_t> gemmNs_{0}, sumNs_{0}, cryptoNs_{0};
  std::mutex lanesMutex_;  // guards lanes_; a leaf: nothing else is taken under it
  CryptoLanes lanes_;
  std::mutex timelineMutex_;  // guards the timelines; a leaf
  DeviceTimeline gpu_;        // the emulated GPU: layers, and the GEMM on a GPU node
  DeviceTimeline gemmCores_;  // a cpu:C node's cores
};

}  // namespace poseidon::bench
