// One registry of the systems the benchmarks compare and the planner models (docs/bench.md): each
// system's name in `poseidon bench` (the throughput bench, with a -bf16/-fp16 wire suffix on
// Poseidon's), how a Poseidon rank runs it (bench-worker), its name in `bench --accuracy` (real
// training; that bench's compute-group systems gG and gGfc are parametric and parsed there), and the
// planner's model of it (`poseidon plan --predict`, `--check`). A new system is one entry here, and
// its worker loop (bench-worker or bench/ddp_worker.py).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "poseidon/core/best_scheme.h"
#include "poseidon/planner/planner.h"
#include "poseidon/wire/precision.h"

namespace poseidon::bench {

struct SystemSpec {
  const char* name;  // poseidon bench --systems
  bool ddp;          // PyTorch DDP (bench/ddp_worker.py); else Poseidon (poseidon bench-worker)
  // Poseidon's: how each layer syncs, whether its sync starts as its backward ends (WFBP), and whether
  // the links are priority-scheduled with the next forward overlapping the sync (docs/scheduling.md).
  SchemePolicy policy;
  bool wfbp;
  bool overlapForward;
  bool wireSuffix;                         // takes -bf16 / -fp16 (Poseidon's but adam)
  std::optional<planner::System> planned;  // the planner's model of it, if it has one
  const char* accuracyName;                // its name in bench --accuracy ("": not run there)
};

// ZeroMQ I/O threads of each emulated Poseidon node, which its CURVE encryption is charged on
// (bench --io-threads): 2, as in every table so far, not the runtime's default (half the host's
// cores; here the host's few cores are every emulated node's).
constexpr int kBenchIoThreads = 2;

// Every system, in the order the tables list them.
const std::vector<SystemSpec>& systemRegistry();

// A throughput-bench system as named (poseidon-overlap-bf16, poseidon-nocurve): its entry, wire
// and transport security (a -nocurve suffix, last, on Poseidon's: --transport-security none).
// InvalidArgument for a name that is not one ("unknown system 'X'"; the adam baseline has no 16-bit
// wire; DDP's links are never encrypted).
struct SystemChoice {
  const SystemSpec* spec = nullptr;
  WirePrecision wire = WirePrecision::kFp32;
  bool noCurve = false;
  std::string base() const { return spec->name; }
};
SystemChoice parseBenchSystem(const std::string& name);

// The entry whose accuracy-bench name is `name`, or nullptr.
const SystemSpec* findAccuracySystem(const std::string& name);

}  // namespace poseidon::bench
