#include "poseidon/core/best_scheme.h"

#include "poseidon/common/error.h"
#include "poseidon/core/cost_model.h"

namespace poseidon {

const char* schemeName(Scheme s) {
  switch (s) {
    case Scheme::kPS: return "ps";
    case Scheme::kSFB: return "sfb";
    case Scheme::kAdam: return "adam";
  }
  return "?";
}

const char* schemePolicyName(SchemePolicy p) {
  switch (p) {
    case SchemePolicy::kAuto: return "auto";
    case SchemePolicy::kPS: return "ps";
    case SchemePolicy::kSFB: return "sfb";
    case SchemePolicy::kAdam: return "adam";
  }
  return "?";
}

SchemePolicy parseSchemePolicy(const std::string& text) {
  if (text == "auto") return SchemePolicy::kAuto;
  if (text == "ps") return SchemePolicy::kPS;
  if (text == "sfb") return SchemePolicy::kSFB;
  if (text == "adam") return SchemePolicy::kAdam;
  throw InvalidArgument("unknown scheme '" + text + "' (expected auto, ps, sfb or adam)");
}

SchemeSeconds schemeSeconds(const LayerSpec& layer, int64_t batch, int workers, int servers,
                            const DeviceModel& device, size_t elementBytes) {
  SchemeSeconds t;
  if (device.linkBytes <= 0 || device.gemmFlops <= 0) return t;
  CostInputs c = costInputs(layer, batch, workers, servers);
  // Table 1's floats are sent + received; the link is full duplex.
  auto wire = [&](double floats) {
    double bytes = floats * static_cast<double>(elementBytes) * device.byteScale;
    double s = bytes / 2 / device.linkBytes;
    if (device.cryptoBytes > 0) s += bytes / device.cryptoBytes;
    return s;
  };
  t.sfb = wire(sfbCost(c)) + 2.0 * static_cast<double>(c.batch) * c.workers * static_cast<double>(c.m) *
                                 static_cast<double>(c.n) * device.flopScale / device.gemmFlops;
  t.ps = wire(psCostBoth(c));
  if (device.sumBytes > 0) {
    // A node's shard adds every worker's share of the layer: P1 M N / P2 floats (in fp32, whatever
    // the wire: a 16-bit push is widened in the same pass).
    t.ps += static_cast<double>(c.workers) * c.m * c.n / c.servers * sizeof(float) * device.byteScale /
            device.sumBytes;
  }
  return t;
}

Scheme bestScheme(const LayerSpec& layer, int64_t batch, int workers, int servers, SchemePolicy policy,
                  const DeviceModel* device, size_t elementBytes) {
  if (layer.type != LayerType::kFC) return Scheme::kPS;
  switch (policy) {
    case SchemePolicy::kPS: return Scheme::kPS;
    case SchemePolicy::kSFB: return Scheme::kSFB;
    case SchemePolicy::kAdam: return Scheme::kAdam;
    case SchemePolicy::kAuto: break;
  }
  if (device && device->linkBytes > 0 && device->gemmFlops > 0) {
    SchemeSeconds t = schemeSeconds(layer, batch, workers, servers, *device, elementBytes);
    return t.sfb <= t.ps ? Scheme::kSFB : Scheme::kPS;
  }
  CostInputs c = costInputs(layer, batch, workers, servers);
  return sfbCost(c) <= psCostBoth(c) ? Scheme::kSFB : Scheme::kPS;
}

}  // namespace poseidon
