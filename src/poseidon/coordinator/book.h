// The coordinator's information book (paper section 4.1): the cluster
// (ranks, roles, data endpoints) and the model (layers, shapes, types, batch
// K), plus the settings every node must share. It is built once at
// rendezvous by the coordinator and sent verbatim to every node, so every
// node holds an identical copy; BestScheme and Query are answered locally
// from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "poseidon/common/bytes.h"
#include "poseidon/core/best_scheme.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/core/kv_layout.h"
#include "poseidon/model/layer.h"
#include "poseidon/wire/precision.h"

namespace poseidon {

enum class Role : uint8_t { kWorker = 1, kServer = 2, kBoth = 3 };
const char* roleName(Role r);
Role parseRole(const std::string& text);  // worker | server | both
inline bool isWorker(Role r) { return r == Role::kWorker || r == Role::kBoth; }
inline bool isServer(Role r) { return r == Role::kServer || r == Role::kBoth; }

struct NodeInfo {
  int rank = 0;
  Role role = Role::kBoth;
  std::string endpoint;  // data endpoint "tcp://host:port"
};

// Settings every node must agree on; each node proposes its own at join and
// the coordinator rejects a job whose nodes disagree.
struct JobSettings {
  int64_t batch = 1;  // nominal per-worker batch K
  int64_t pairBytes = kDefaultPairBytes;
  int64_t startIteration = 0;
  SchemePolicy policy = SchemePolicy::kAuto;
  // Straggler dropping (paper section 4.1; off when 0): a KV pair or SFB
  // round that has waited stragglerTimeoutMs after its first P1 - D
  // contributions proceeds with those it has.
  int dropStragglers = 0;
  int64_t stragglerTimeoutMs = 0;
  bool stragglerMode() const { return dropStragglers > 0; }
  // Omnivore's compute groups (docs/omnivore.md; off when 0): the P1 workers
  // form `groups` groups of P1 / groups consecutive workers, synchronous inside
  // and asynchronous across; the KV shards hold the model and its SGD state
  // (momentum, weightDecay; the learning rate comes with each update) and
  // apply each group's summed gradient as it arrives. `staleness` bounds how
  // many updates a group may run ahead of the slowest (SSP; -1: unbounded).
  int groups = 0;
  int64_t staleness = -1;
  float momentum = 0;
  float weightDecay = 0;
  bool groupMode() const { return groups > 0; }
  // What gradients travel as (wire/precision.h): fp32 (exact, the default) or
  // a lossy 16-bit format for PS pairs and SFB factors, summed in fp32.
  WirePrecision wire = WirePrecision::kFp32;
  // Several ranks (GPUs) per machine, aggregated on a leader (the paper's nodes; client/local_group.h,
  // docs/gpu.md): ranks r..r+L-1 with r % L == 0 share a machine and rank r is their leader. Only
  // leaders are workers and servers on the network; each carries its members' L x batch rows (SFB) or
  // their summed gradient (PS). 1, the default: every rank is its own node. 0: one node per host,
  // found at rendezvous from the ranks' data endpoints (each host a run of L consecutive ranks).
  int localRanks = 1;
  bool operator==(const JobSettings& o) const {
    return localRanks == o.localRanks && batch == o.batch && pairBytes == o.pairBytes &&
           startIteration == o.startIteration && policy == o.policy && dropStragglers == o.dropStragglers &&
           stragglerTimeoutMs == o.stragglerTimeoutMs && groups == o.groups && staleness == o.staleness &&
           momentum == o.momentum && weightDecay == o.weightDecay && wire == o.wire;
  }
  std::string describe() const;
  // "" if every field is in the range a job can run with, else the first one that is not, named with its
  // value ("groups must be 0 (BSP) or in [1, 65536], got -1"): Node::start refuses such settings before
  // the rendezvous (InvalidArgument), and the book's reader a message that carries them (ProtocolError).
  std::string rangeError() const;
  // "" unless two settings exclude each other (compute groups and straggler dropping, the adam baseline
  // with groups, stragglers, a 16-bit wire or local ranks, ...), else the pair, named by the CLI's flags:
  // known from the settings alone, so Node::start and poseidon train refuse them before any rank waits
  // at the rendezvous, and the book again for a message that carries them. `localRanksFlag` names
  // localRanks in the message (default "--local-ranks L"; the book's for an L found at the rendezvous).
  std::string conflictError(const std::string& localRanksFlag = "") const;
};

// What Query(layer) answers.
struct LayerQuery {
  const LayerSpec* layer = nullptr;
  int index = 0;
  Scheme scheme = Scheme::kPS;  // BestScheme at the nominal batch
  const std::vector<KvPair>* pairs = nullptr;
};

class InformationBook {
 public:
  InformationBook() = default;
  InformationBook(uint64_t jobId, std::vector<NodeInfo> nodes, ModelDesc model, JobSettings settings);

  uint64_t jobId() const { return jobId_; }
  const std::vector<NodeInfo>& nodes() const { return nodes_; }
  int worldSize() const { return static_cast<int>(nodes_.size()); }
  const ModelDesc& model() const { return model_; }
  const JobSettings& settings() const { return settings_; }
  const KvLayout& layout() const { return layout_; }

  // Worker ranks ascending; a worker's index is its position here (P1 = size).
  const std::vector<int>& workerRanks() const { return workers_; }
  // Server ranks ascending; shard s lives on serverRanks()[s] (P2 = size).
  const std::vector<int>& serverRanks() const { return servers_; }
  int numWorkers() const { return static_cast<int>(workers_.size()); }
  int numServers() const { return static_cast<int>(servers_.size()); }
  int workerIndex(int rank) const;  // -1 if not a worker
  // Local aggregation (JobSettings::localRanks = L): a rank's leader, and whether it is a member
  // (a rank of a machine other than its leader: neither worker nor server on the network).
  // The L in use (settings' localRanks, or the ranks per host when that is 0).
  int localRanks() const { return localRanks_; }
  int leaderOf(int rank) const { return rank - rank % localRanks_; }
  bool isLocalMember(int rank) const { return rank % localRanks_ != 0; }
  // Group mode: the group of a worker index, and the workers per group (k = P1 / g).
  int groupOf(int worker) const { return settings_.groups > 0 ? worker / groupSize() : 0; }
  int groupSize() const { return settings_.groups > 0 ? numWorkers() / settings_.groups : numWorkers(); }
  int shardIndex(int rank) const;   // -1 if not a server
  int shardRank(int shard) const { return servers_.at(shard); }
  // The server that keeps a whole layer: the shard owning the layer's first
  // KV pair. It is Project Adam's server for the layer (benchmark baseline)
  // and, in straggler mode, the keeper of the layer's SFB rounds.
  int layerKeeperRank(int layer) const { return servers_.at(layout_.pairsOf(layer).at(0).shard); }

  // BestScheme(l) with this cluster's P1, P2 and the given per-rank batch (times localRanks: a leader
  // carries its machine's rows), weighing the
  // reconstruction against the bytes where a device model is set.
  Scheme bestScheme(int layer, int64_t batch) const;
  LayerQuery query(int layer) const;
  // The modelled node's rates (the bench's, common/work_charger.h; every rank has the same).
  // Null, the default: bytes alone decide. Not owned; must outlive the book.
  void setDeviceModel(const DeviceModel* device) { device_ = device; }

  void write(ByteWriter& w) const;
  static InformationBook read(ByteReader& r);  // throws ProtocolError

 private:
  void derive();
  uint64_t jobId_ = 0;
  std::vector<NodeInfo> nodes_;
  ModelDesc model_;
  JobSettings settings_;
  std::vector<int> workers_, servers_, workerIndex_, shardIndex_;
  KvLayout layout_;
  const DeviceModel* device_ = nullptr;
  int localRanks_ = 1;
};

// Model and settings serialization shared by join requests and the book.
void writeModel(ByteWriter& w, const ModelDesc& m);
ModelDesc readModel(ByteReader& r);
void writeSettings(ByteWriter& w, const JobSettings& s);
JobSettings readSettings(ByteReader& r);

}  // namespace poseidon
