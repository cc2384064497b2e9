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

Scheme bestScheme(const LayerSpec& layer, int64_t batch, int workers, int servers, SchemePolicy policy) {
  if (layer.type != LayerType::kFC) return Scheme::kPS;
  switch (policy) {
    case SchemePolicy::kPS: return Scheme::kPS;
    case SchemePolicy::kSFB: return Scheme::kSFB;
    case SchemePolicy::kAdam: return Scheme::kAdam;
    case SchemePolicy::kAuto: break;
  }
  CostInputs c = costInputs(layer, batch, workers, servers);
  return sfbCost(c) <= psCostBoth(c) ? Scheme::kSFB : Scheme::kPS;
}

}  // namespace poseidon
