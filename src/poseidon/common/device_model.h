// The runtime's own work, charged at full width on a modelled device.
//
// The emulated-cluster benchmark shrinks every width by s (DESIGN.md section
// 4) while the emulated GPU time stays fixed. The runtime's own work shrinks
// with the widths too: the SFB reconstruction GEMM (m x n x K) by s^3, the
// servers' sums and the CURVE encryption of every byte by s^2. Measured at
// scale, that work is nearly free; at full width it is not (vgg19's
// reconstruction on one core of a CPU takes about a second per iteration).
// A DeviceModel says how fast the node that does each kind of work is; the
// runtime then holds the thread that did the work until the work's
// full-width cost has passed, as the device would have been busy that long.
//
// Process-wide on purpose: the work happens on the syncers' pool threads,
// the server's thread and the transport's callers, and a benchmark rank
// sets the model once before it starts its Node. With the default model
// (every rate 0) nothing is charged and nothing waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace poseidon {

struct DeviceModel {
  std::string name = "none";
  double flopScale = 1;    // scaled GEMM FLOPs -> full width (1 / s^3)
  double byteScale = 1;    // scaled bytes -> full width (1 / s^2)
  double gemmFlops = 0;    // FLOP/s of the reconstruction GEMM (0: not charged)
  double sumBytes = 0;     // bytes/s of the servers' element-wise sums (0: not charged)
  double cryptoBytes = 0;  // bytes/s of CURVE's XSalsa20-Poly1305, each side of a link (0: not charged)
  // Bytes/s each way of a node's link (0: unknown). With it and a GEMM rate,
  // BestScheme weighs the reconstruction against the bytes (core/best_scheme.h).
  double linkBytes = 0;
  // ZeroMQ I/O threads per process (NodeOptions::ioThreads): encryption runs on them, each
  // connection on one, so up to this many connections are encrypted at once.
  int cryptoLanes = 1;
  bool charges() const { return gemmFlops > 0 || sumBytes > 0 || cryptoBytes > 0; }
};

// Set once, before any Node starts in this process.
void setDeviceModel(const DeviceModel& model);
const DeviceModel& deviceModel();

using WorkClock = std::chrono::steady_clock;

// Hold the caller until the full-width cost of work that began at `start`
// has passed (the real time already spent counts toward it).
void chargeGemm(double scaledFlops, WorkClock::time_point start);
void chargeSum(double scaledBytes, WorkClock::time_point start);
// Encryption runs on ZeroMQ's I/O threads, out of our sight. Each connection
// is encrypted by one I/O thread (connection % cryptoLanes), one message after
// another: a message waits for the earlier ones on its lane. admitCrypto puts
// the message's full-width cost on its lane and returns when the lane is done
// with it, without waiting (the transport holds the message until then: the
// caller goes on, as it does with ZeroMQ's I/O threads); WorkClock::time_point::min()
// when encryption is not charged. chargeCrypto holds the caller until then.
WorkClock::time_point admitCrypto(double scaledBytes, int connection);
void chargeCrypto(double scaledBytes, int connection);

// The I/O threads' timelines behind chargeCrypto: a message on `connection`
// starts when its lane is free (or now) and ends `cost` later.
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

// Seconds charged so far in this process, real time included, per kind.
struct ChargedSeconds {
  double gemm = 0, sum = 0, crypto = 0;
};
ChargedSeconds chargedSeconds();

}  // namespace poseidon
