#include "poseidon/bench/systems.h"

#include "poseidon/common/error.h"

namespace poseidon::bench {

const std::vector<SystemSpec>& systemRegistry() {
  using planner::System;
  using P = SchemePolicy;
  // One row per system, its columns aligned.
  // clang-format off
  static const std::vector<SystemSpec> systems{
      // name              ddp    policy    wfbp   overlap-fwd wire   planner                   accuracy
      {"poseidon",         false, P::kAuto, true,  false,      true,  System::kPoseidon,        "bsp"},
      {"poseidon-overlap", false, P::kAuto, true,  true,       true,  System::kPoseidonOverlap, "bsp-overlap"},
      {"ps-wfbp",          false, P::kPS,   true,  false,      true,  System::kPsWfbp,          ""},
      {"ps-naive",         false, P::kPS,   false, false,      true,  System::kPsNaive,         ""},
      {"adam",             false, P::kAdam, true,  false,      false, std::nullopt,             ""},
      {"sfb",              false, P::kSFB,  true,  false,      true,  std::nullopt,             ""},
      {"ddp",              true,  P::kAuto, false, false,      false, System::kDdp,             "ddp"},
      {"ddp-tuned",        true,  P::kAuto, false, false,      false, std::nullopt,             ""},
      {"ddp-fp16",         true,  P::kAuto, false, false,      false, System::kDdpFp16,         ""},
      {"ddp-powersgd1",    true,  P::kAuto, false, false,      false, std::nullopt,             ""},
      {"ddp-powersgd4",    true,  P::kAuto, false, false,      false, std::nullopt,             ""},
  };
  // clang-format on
  return systems;
}

namespace {

const SystemSpec* findBenchSystem(const std::string& name) {
  for (const SystemSpec& s : systemRegistry())
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace

SystemChoice parseBenchSystem(const std::string& fullName) {
  static const std::string kNoCurve = "-nocurve";
  const bool noCurve = fullName.size() > kNoCurve.size() &&
                       fullName.compare(fullName.size() - kNoCurve.size(), kNoCurve.size(), kNoCurve) == 0;
  const std::string name = noCurve ? fullName.substr(0, fullName.size() - kNoCurve.size()) : fullName;
  SystemChoice c{findBenchSystem(name), WirePrecision::kFp32, noCurve};
  for (WirePrecision w : {WirePrecision::kBf16, WirePrecision::kFp16}) {
    const std::string suffix = std::string("-") + wirePrecisionName(w);
    if (c.spec || name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const SystemSpec* base = findBenchSystem(name.substr(0, name.size() - suffix.size()));
    if (base && !base->ddp) c = {base, w};
    if (base && base->ddp)
      throw InvalidArgument("unknown system '" + fullName + "' (a DDP baseline takes no " + suffix +
                            " suffix: ddp-fp16 is DDP with its fp16 compression hook)");
  }
  if (c.spec) c.noCurve = noCurve;
  if (!c.spec) {
    const bool misplaced = fullName.find("-nocurve") != std::string::npos;
    if (misplaced) throw InvalidArgument("unknown system '" + fullName + "' (-nocurve goes last)");
    std::string known;
    for (const SystemSpec& s : systemRegistry()) known += (known.empty() ? "" : ", ") + std::string(s.name);
    throw InvalidArgument("unknown system '" + fullName + "' (the systems: " + known +
                          "; a Poseidon one takes -nocurve last, and all but adam -bf16 or -fp16 before it)");
  }
  if (c.wire != WirePrecision::kFp32 && !c.spec->wireSuffix) {
    throw InvalidArgument("unknown system '" + fullName + "' (the " + c.spec->name + " baseline has no 16-bit wire)");
  }
  if (c.noCurve && c.spec->ddp) {
    throw InvalidArgument("unknown system '" + fullName +
                          "' (DDP's Gloo links are never encrypted: -nocurve is "
                          "for Poseidon's)");
  }
  return c;
}

const SystemSpec* findAccuracySystem(const std::string& name) {
  for (const SystemSpec& s : systemRegistry())
    if (*s.accuracyName && name == s.accuracyName) return &s;
  return nullptr;
}

}  // namespace poseidon::bench
