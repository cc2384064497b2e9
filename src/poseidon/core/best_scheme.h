// BestScheme (paper Algorithm 1): per layer and per iteration, the cheaper of
// the sharded parameter server (PS) and sufficient-factor broadcasting (SFB),
// by the Table 1 costs of core/cost_model.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "poseidon/common/device_model.h"
#include "poseidon/model/layer.h"

namespace poseidon {

// kAdam is Project Adam's scheme (factors up to the one server that holds
// the layer, the full matrix back down): never chosen by BestScheme, only
// forced, as the traffic-balance baseline of the benchmark.
enum class Scheme : uint8_t { kPS = 0, kSFB = 1, kAdam = 2 };
const char* schemeName(Scheme s);  // "ps", "sfb", "adam"

// A user's choice: let BestScheme decide, or force one scheme (SFB applies to
// FC layers only; everything else still goes by PS).
enum class SchemePolicy : uint8_t { kAuto = 0, kPS = 1, kSFB = 2, kAdam = 3 };
const char* schemePolicyName(SchemePolicy p);
SchemePolicy parseSchemePolicy(const std::string& text);  // throws InvalidArgument

// Algorithm 1: SFB if the layer is FC and 2K(P1-1)(M+N) <= 2MN(P1+P2-2)/P2,
// else PS. `policy` can force a scheme; SFB is only ever used for FC layers.
//
// With a device model that knows the link rate and the GEMM rate
// (`device->linkBytes > 0 && device->gemmFlops > 0`), bytes alone no longer
// decide: where reconstruction is slow (a CPU node: Omnivore's setting) SFB's
// K P1 M N multiply-adds can cost more than the bytes it saves. Each scheme
// is then timed at full width: its bytes each way over the link, every byte
// once through encryption, and SFB's GEMM or PS's server sums, and the faster
// wins. Every node must pass the same model (the bench gives all ranks one).
// `elementBytes`: what one float takes on the wire (4; 2 with a 16-bit wire,
// wire/precision.h). Both schemes' bytes scale alike, so it only matters
// where the GEMM and the sums are weighed against the bytes.
Scheme bestScheme(const LayerSpec& layer, int64_t batch, int workers, int servers,
                  SchemePolicy policy = SchemePolicy::kAuto, const DeviceModel* device = nullptr,
                  size_t elementBytes = sizeof(float));

// The seconds each scheme takes for one layer per iteration under `device`
// (as above; both 0 without a link and GEMM rate).
struct SchemeSeconds {
  double ps = 0, sfb = 0;
};
SchemeSeconds schemeSeconds(const LayerSpec& layer, int64_t batch, int workers, int servers,
                            const DeviceModel& device, size_t elementBytes = sizeof(float));

}  // namespace poseidon
