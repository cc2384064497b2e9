#include "poseidon/coordinator/book.h"

#include "poseidon/common/error.h"
#include "poseidon/wire/frame.h"

namespace poseidon {

const char* roleName(Role r) {
  switch (r) {
    case Role::kWorker: return "worker";
    case Role::kServer: return "server";
    case Role::kBoth: return "both";
  }
  return "?";
}

Role parseRole(const std::string& text) {
  if (text == "worker") return Role::kWorker;
  if (text == "server") return Role::kServer;
  if (text == "both") return Role::kBoth;
  throw InvalidArgument("unknown role '" + text + "' (expected worker, server or both)");
}

std::string JobSettings::rangeError() const {
  auto out = [](const char* what, auto v, const char* allowed) {
    return strCat(what, " must be ", allowed, ", got ", v);
  };
  if (batch < 1) return strCat("the batch must be at least 1, got ", batch);
  if (pairBytes < 4 || pairBytes > static_cast<int64_t>(kDefaultMaxPayloadBytes)) {
    return strCat("the KV pair size must be in [4, ", kDefaultMaxPayloadBytes, "] bytes, got ", pairBytes);
  }
  if (startIteration < 0) return out("startIteration", startIteration, ">= 0");
  if (dropStragglers < 0 || dropStragglers > (1 << 16)) return out("dropStragglers", dropStragglers, "in [0, 65536]");
  if (stragglerTimeoutMs < 0) return out("stragglerTimeoutMs", stragglerTimeoutMs, ">= 0");
  if (groups < 0 || groups > (1 << 16)) return out("groups", groups, "0 (BSP) or in [1, 65536]");
  if (staleness < -1) return out("staleness", staleness, "-1 (unbounded) or >= 0");
  if (!(momentum >= 0 && momentum < 1)) return out("momentum", momentum, "in [0, 1)");
  if (!(weightDecay >= 0 && weightDecay < 1)) return out("weightDecay", weightDecay, "in [0, 1)");
  if (localRanks < 0 || localRanks > (1 << 12))
    return out("localRanks", localRanks, "0 (one node per host) or in [1, 4096]");
  return "";
}

std::string JobSettings::conflictError(const std::string& localRanksFlag) const {
  const bool adam = policy == SchemePolicy::kAdam;
  if (localRanks > 1) {
    // What the leader's aggregation does not cover (docs/gpu.md): each of these keeps per-rank
    // state or timing on the network that a member does not have.
    const char* refused = groupMode()       ? "--groups"
                          : stragglerMode() ? "--drop-stragglers"
                          : adam            ? "the adam baseline"
                                            : nullptr;
    if (refused) {
      return strCat(localRanksFlag.empty() ? strCat("--local-ranks ", localRanks) : localRanksFlag,
                    " cannot be combined with ", refused);
    }
  }
  if (stragglerMode() && adam) return "straggler dropping does not apply to the adam baseline";
  if (groupMode()) {
    if (stragglerMode()) return "--groups and --drop-stragglers cannot be combined";
    if (adam) return "--groups does not apply to the adam baseline";
    // The 16-bit wire covers BSP's PS pairs and SFB factors; the groups' model traffic (pulls carry
    // the model itself) stays exact.
    if (wire != WirePrecision::kFp32)
      return strCat("--wire ", wirePrecisionName(wire), " and --groups cannot be combined");
  }
  // The baseline's traffic stays exact too.
  if (wire != WirePrecision::kFp32 && adam) {
    return strCat("--wire ", wirePrecisionName(wire), " does not apply to the adam baseline (use --wire fp32)");
  }
  return "";
}

std::string JobSettings::describe() const {
  return strCat("batch=", batch, " pair-bytes=", pairBytes, " start-iteration=", startIteration,
                " scheme=", schemePolicyName(policy), " drop-stragglers=", dropStragglers,
                " straggler-timeout=", stragglerTimeoutMs, "ms groups=", groups, " staleness=", staleness,
                " momentum=", momentum, " weight-decay=", weightDecay, " wire=", wirePrecisionName(wire),
                " local-ranks=", localRanks);
}

InformationBook::InformationBook(uint64_t jobId, std::vector<NodeInfo> nodes, ModelDesc model, JobSettings settings)
    : jobId_(jobId), nodes_(std::move(nodes)), model_(std::move(model)), settings_(settings) {
  derive();
}

namespace {

// "tcp://host:port" -> "host".
std::string endpointHost(const std::string& endpoint) {
  const size_t begin = endpoint.find("://") == std::string::npos ? 0 : endpoint.find("://") + 3;
  const size_t colon = endpoint.rfind(':');
  return endpoint.substr(begin, colon == std::string::npos || colon < begin ? std::string::npos : colon - begin);
}

// JobSettings::localRanks = 0: the ranks per host, from the data endpoints. Each host must hold a run of
// consecutive ranks (as torchrun, Slurm and poseidon launch number them), every host as many.
int ranksPerHost(const std::vector<NodeInfo>& nodes) {
  std::vector<std::pair<std::string, int>> runs;  // host, ranks
  for (const NodeInfo& n : nodes) {
    const std::string host = endpointHost(n.endpoint);
    if (!runs.empty() && runs.back().first == host) {
      ++runs.back().second;
      continue;
    }
    for (const auto& run : runs) {
      if (run.first == host) {
        throw InvalidArgument(strCat("--local-ranks 0 (one node per host): the ranks of host ", host,
                                     " are not consecutive (rank ", n.rank, " follows ranks of host ",
                                     runs.back().first, ")"));
      }
    }
    runs.push_back({host, 1});
  }
  for (const auto& run : runs) {
    if (run.second != runs.front().second) {
      throw InvalidArgument(strCat("--local-ranks 0 (one node per host): every host must hold as many ranks (",
                                   runs.front().first, " has ", runs.front().second, ", ", run.first, " has ",
                                   run.second, ")"));
    }
  }
  return runs.empty() ? 1 : runs.front().second;
}

}  // namespace

void InformationBook::derive() {
  if (settings_.localRanks < 0)
    throw InvalidArgument(strCat("local ranks must be at least 0, got ", settings_.localRanks));
  localRanks_ = settings_.localRanks == 0 ? ranksPerHost(nodes_) : settings_.localRanks;
  const int L = localRanks_;
  const std::string flag =
      settings_.localRanks == 0 ? strCat("--local-ranks 0 (", L, " ranks per host)") : strCat("--local-ranks ", L);
  if (L > 1) {
    if (nodes_.size() % static_cast<size_t>(L) != 0) {
      throw InvalidArgument(strCat(flag, " must divide the ", nodes_.size(), " ranks"));
    }
    for (const auto& n : nodes_) {
      if (n.role != Role::kBoth) {
        throw InvalidArgument(
            strCat(flag, ": every rank must be both worker and server (rank ", n.rank, " is ", roleName(n.role), ")"));
      }
    }
    // conflictError's, for an L found at the rendezvous (--local-ranks 0) too, named as given.
    JobSettings resolved = settings_;
    resolved.localRanks = L;
    if (const std::string why = resolved.conflictError(flag); !why.empty()) throw InvalidArgument(why);
  }
  if (const std::string why = settings_.conflictError(); !why.empty()) throw InvalidArgument(why);
  workers_.clear();
  servers_.clear();
  workerIndex_.assign(nodes_.size(), -1);
  shardIndex_.assign(nodes_.size(), -1);
  for (size_t r = 0; r < nodes_.size(); ++r) {
    if (nodes_[r].rank != static_cast<int>(r)) throw ProtocolError(strCat("book lists rank ", nodes_[r].rank, " at slot ", r));
    // A machine's members hand their updates to its leader (client/local_group.h): on the network
    // they are neither workers nor servers.
    const bool member = L > 1 && static_cast<int>(r) % L != 0;
    if (isWorker(nodes_[r].role) && !member) {
      workerIndex_[r] = static_cast<int>(workers_.size());
      workers_.push_back(static_cast<int>(r));
    }
    if (isServer(nodes_[r].role) && !member) {
      shardIndex_[r] = static_cast<int>(servers_.size());
      servers_.push_back(static_cast<int>(r));
    }
  }
  if (workers_.empty()) throw InvalidArgument("the job has no worker ranks (every rank is --role server)");
  if (servers_.empty()) throw InvalidArgument("the job has no server ranks (every rank is --role worker)");
  if (settings_.stragglerMode()) {
    if (settings_.dropStragglers >= static_cast<int>(workers_.size())) {
      throw InvalidArgument(strCat("--drop-stragglers ", settings_.dropStragglers, " must be less than the ",
                                   workers_.size(), " workers"));
    }
    if (settings_.stragglerTimeoutMs <= 0)
      throw InvalidArgument("straggler dropping needs a positive --straggler-timeout");
  }
  if (settings_.groupMode()) {
    const int workers = static_cast<int>(workers_.size());
    if (workers % settings_.groups != 0) {
      throw InvalidArgument(strCat("--groups ", settings_.groups, " must divide the ", workers, " workers"));
    }
  }
  layout_ = KvLayout::balanced(model_, static_cast<int>(servers_.size()), settings_.pairBytes);
}

int InformationBook::workerIndex(int rank) const {
  return rank >= 0 && rank < worldSize() ? workerIndex_[rank] : -1;
}

int InformationBook::shardIndex(int rank) const {
  return rank >= 0 && rank < worldSize() ? shardIndex_[rank] : -1;
}

Scheme InformationBook::bestScheme(int layer, int64_t batch) const {
  return poseidon::bestScheme(model_.layers.at(layer), batch * localRanks_, numWorkers(), numServers(),
                              settings_.policy, device_, wireElementBytes(settings_.wire));
}

LayerQuery InformationBook::query(int layer) const {
  LayerQuery q;
  q.layer = &model_.layers.at(layer);
  q.index = layer;
  q.scheme = bestScheme(layer, settings_.batch);
  q.pairs = &layout_.pairsOf(layer);
  return q;
}

namespace {
constexpr uint32_t kMaxLayers = 1 << 20;
constexpr uint32_t kMaxParams = 64;
constexpr uint32_t kMaxDims = 8;
constexpr uint32_t kMaxNodes = 1 << 16;
constexpr int64_t kMaxNumel = int64_t{1} << 40;
}  // namespace

void writeModel(ByteWriter& w, const ModelDesc& m) {
  w.str(m.name);
  w.u32(static_cast<uint32_t>(m.layers.size()));
  for (const auto& l : m.layers) {
    w.str(l.name);
    w.u8(static_cast<uint8_t>(l.type));
    w.i64(l.m);
    w.i64(l.n);
    w.i64(l.macsPerSample);
    w.u32(static_cast<uint32_t>(l.params.size()));
    for (const auto& p : l.params) {
      w.str(p.name);
      w.u32(static_cast<uint32_t>(p.shape.size()));
      for (int64_t d : p.shape) w.i64(d);
    }
  }
}

ModelDesc readModel(ByteReader& r) {
  ModelDesc m;
  m.name = r.str();
  uint32_t layers = r.count(8, kMaxLayers);
  m.layers.reserve(layers);
  for (uint32_t i = 0; i < layers; ++i) {
    LayerSpec l;
    l.name = r.str();
    uint8_t type = r.u8();
    if (type > static_cast<uint8_t>(LayerType::kOther)) throw ProtocolError(strCat("layer ", i, " has unknown type ", int(type)));
    l.type = static_cast<LayerType>(type);
    l.m = r.i64();
    l.n = r.i64();
    l.macsPerSample = r.i64();
    uint32_t params = r.count(8, kMaxParams);
    int64_t numel = 0;
    for (uint32_t p = 0; p < params; ++p) {
      ParamSpec ps;
      ps.name = r.str();
      uint32_t dims = r.count(8, kMaxDims);
      int64_t n = 1;
      for (uint32_t d = 0; d < dims; ++d) {
        int64_t v = r.i64();
        if (v <= 0 || v > kMaxNumel || n > kMaxNumel / v) throw ProtocolError(strCat("layer ", i, " has a bad dimension ", v));
        n *= v;
        ps.shape.push_back(v);
      }
      numel += n;
      if (numel > kMaxNumel) throw ProtocolError(strCat("layer ", i, " is too large"));
      l.params.push_back(std::move(ps));
    }
    if (l.type == LayerType::kFC) {
      if (l.m <= 0 || l.n <= 0 || l.params.empty() || l.params[0].shape != std::vector<int64_t>{l.m, l.n}) {
        throw ProtocolError(strCat("fc layer ", i, " has inconsistent shape"));
      }
    }
    m.layers.push_back(std::move(l));
  }
  return m;
}

void writeSettings(ByteWriter& w, const JobSettings& s) {
  w.i64(s.batch);
  w.i64(s.pairBytes);
  w.i64(s.startIteration);
  w.u8(static_cast<uint8_t>(s.policy));
  w.u32(static_cast<uint32_t>(s.dropStragglers));
  w.i64(s.stragglerTimeoutMs);
  w.u32(static_cast<uint32_t>(s.groups));
  w.i64(s.staleness);
  w.f32(s.momentum);
  w.f32(s.weightDecay);
  w.u8(static_cast<uint8_t>(s.wire));
  w.u32(static_cast<uint32_t>(s.localRanks));
}

JobSettings readSettings(ByteReader& r) {
  JobSettings s;
  s.batch = r.i64();
  s.pairBytes = r.i64();
  s.startIteration = r.i64();
  uint8_t p = r.u8();
  if (p > 3) throw ProtocolError("scheme policy out of range");
  s.policy = static_cast<SchemePolicy>(p);
  s.dropStragglers = static_cast<int>(r.u32());
  s.stragglerTimeoutMs = r.i64();
  s.groups = static_cast<int>(r.u32());
  s.staleness = r.i64();
  s.momentum = r.f32();
  s.weightDecay = r.f32();
  const uint8_t wire = r.u8();
  if (wire > static_cast<uint8_t>(WirePrecision::kFp16)) throw ProtocolError("wire precision out of range");
  s.wire = static_cast<WirePrecision>(wire);
  s.localRanks = static_cast<int>(r.u32());
  if (const std::string why = s.rangeError(); !why.empty()) throw ProtocolError("job settings out of range: " + why);
  return s;
}

void InformationBook::write(ByteWriter& w) const {
  w.u64(jobId_);
  w.u32(static_cast<uint32_t>(nodes_.size()));
  for (const auto& n : nodes_) {
    w.u32(static_cast<uint32_t>(n.rank));
    w.u8(static_cast<uint8_t>(n.role));
    w.str(n.endpoint);
  }
  writeModel(w, model_);
  writeSettings(w, settings_);
}

InformationBook InformationBook::read(ByteReader& r) {
  uint64_t job = r.u64();
  uint32_t n = r.count(9, kMaxNodes);
  std::vector<NodeInfo> nodes;
  for (uint32_t i = 0; i < n; ++i) {
    NodeInfo info;
    info.rank = static_cast<int>(r.u32());
    uint8_t role = r.u8();
    if (role < 1 || role > 3) throw ProtocolError(strCat("node ", i, " has unknown role ", int(role)));
    info.role = static_cast<Role>(role);
    info.endpoint = r.str(1024);
    nodes.push_back(std::move(info));
  }
  ModelDesc model = readModel(r);
  JobSettings settings = readSettings(r);
  r.expectEnd();
  return InformationBook(job, std::move(nodes), std::move(model), settings);
}

}  // namespace poseidon
