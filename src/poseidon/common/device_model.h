// The rates of a modelled node: how fast the node that does each kind of the
// runtime's own work is, and the scale factors from the bench's scaled widths
// back to full width. Plain data: the bench charges the work with it
// (bench/device.h, through common/work_charger.h), BestScheme and the planner
// weigh the reconstruction against the bytes with it.
#pragma once

#include <string>

namespace poseidon {

struct DeviceModel {
  std::string name = "none";
  double flopScale = 1;    // scaled GEMM FLOPs -> full width (1 / s^3)
  double byteScale = 1;    // scaled bytes -> full width (1 / s^2)
  double gemmFlops = 0;    // FLOP/s of the reconstruction GEMM (0: not charged)
  bool gemmOnGpu = false;  // the GEMM runs on the GPU that computes the layers (else on host cores)
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

}  // namespace poseidon
