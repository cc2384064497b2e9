// The device model of `poseidon bench --device` (common/device_model.h says
// what is charged and where). This machine's own rates are measured once at
// the start of a bench run; the modelled node is then
//   gpu    the GPU class the compute tables come from (Titan X, Maxwell: 5
//          TFLOP/s of sustained SGEMM, about 75% of its 6.6 TFLOP/s peak) for
//          the reconstruction GEMM; the servers' sums and CURVE encryption
//          stay on the host CPU at this machine's measured one-core rates;
//   cpu:C  a CPU-only node: the GEMM at this machine's measured one-core rate
//          times C cores, sums and encryption as above;
//   none   nothing charged (the work costs its real time at width s).
#pragma once

#include <string>

#include "poseidon/common/device_model.h"

namespace poseidon::bench {

struct MachineRates {
  double gemmFlops = 0;    // one core: the reconstruction GEMM (Eigen), m = n = 1024, K = 256
  double sumBytes = 0;     // one core: a server's copy-and-add of a 2 MB pair
  double cryptoBytes = 0;  // one core: XSalsa20-Poly1305 (libsodium crypto_secretbox) over 2 MB
};

constexpr double kTitanXGemmFlops = 5e12;

// About a second of measuring; best of a few tries each.
MachineRates measureMachineRates();

// Throws InvalidArgument for a spec other than none, gpu, cpu:C (C in [1, 256]).
DeviceModel deviceFor(const std::string& spec, double scale, const MachineRates& rates);

}  // namespace poseidon::bench
