// The runtime's own work, charged at full width: the seam through which the
// emulated-cluster benchmark (bench/device.h) makes the runtime pay what the
// scaling hides.
//
// The bench shrinks every width by s (DESIGN.md section 4) while the emulated
// GPU time stays fixed. The runtime's own work shrinks with the widths too: the
// SFB reconstruction GEMM (m x n x K) by s^3, the servers' sums and CURVE's
// encryption of every byte by s^2. A WorkCharger holds the thread that did the
// work until its full-width cost has passed, as the modelled device would have
// been busy that long.
//
// Injected, not global: NodeOptions::charger reaches the Van, the Syncers and
// the KV server of that node. Production leaves it null, and the helpers below
// then charge nothing and never wait.
#pragma once

#include <chrono>

namespace poseidon {

struct DeviceModel;  // common/device_model.h: the rates BestScheme weighs

using WorkClock = std::chrono::steady_clock;

class WorkCharger {
 public:
  virtual ~WorkCharger() = default;
  // The modelled node's rates, for BestScheme (core/best_scheme.h) to weigh
  // the reconstruction against the bytes.
  virtual const DeviceModel& model() const = 0;
  // Hold the caller until the full-width cost of work that began at `start`
  // has passed (the real time already spent counts toward it).
  virtual void chargeGemm(double scaledFlops, WorkClock::time_point start) = 0;
  virtual void chargeSum(double scaledBytes, WorkClock::time_point start) = 0;
  // Whether CURVE's encryption is charged (the transport then holds each
  // message until admitCrypto's time).
  virtual bool chargesCrypto() const = 0;
  // Encryption runs on ZeroMQ's I/O threads, out of our sight. Each connection
  // is encrypted by one I/O thread, one message after another: a message waits
  // for the earlier ones on its lane. Puts the message's full-width cost on its
  // lane and returns when the lane is done with it, without waiting (the
  // transport holds the message until then, as ZeroMQ's I/O threads do);
  // WorkClock::time_point::min() when encryption is not charged.
  virtual WorkClock::time_point admitCrypto(double scaledBytes, int connection) = 0;
};

// The runtime's calls: a null charger (production) charges nothing.
inline void chargeGemm(WorkCharger* charger, double scaledFlops, WorkClock::time_point start) {
  if (charger) charger->chargeGemm(scaledFlops, start);
}
inline void chargeSum(WorkCharger* charger, double scaledBytes, WorkClock::time_point start) {
  if (charger) charger->chargeSum(scaledBytes, start);
}

}  // namespace poseidon
