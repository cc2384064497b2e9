// poseidon._poseidon: the Python binding of pt::DistributedModel (the package
// around it is python/poseidon/__init__.py).
//
// Python's torch and this module share one LibTorch in the process (Debian's
// python3-torch links the libtorch1.13 libraries that libtorch-dev builds
// against), so the C++ runtime works on the Python tensors themselves: the
// gradient-accumulator hooks, the factor capture and the in-place writes of
// the mean gradients into .grad are those of the C++ library.
//
// The model is described from its parameters (layer name, kind, tensors), not
// as a torch::nn::Module: Python modules are not C++ modules, and torch._C
// already registers torch::nn::Module with pybind11.
//
// Every call that can block (rendezvous, synchronize, finish, close) releases
// the GIL: a rank waiting for its peers must not stop the rest of its own
// Python program. The runtime's threads never take it, but for one: merged FC's
// server on rank 0 calls the Python classifier with the GIL taken for the call.
#include <torch/extension.h>
#include <unistd.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "poseidon/common/crash.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/merged_fc.h"

namespace py = pybind11;
using namespace poseidon;

namespace {

// Options as a dict, so that the Python side can read the environment's, change a few and
// pass them back.
py::dict optionsToDict(const pt::DistributedOptions& o) {
  py::dict d;
  d["rank"] = o.node.rank;
  d["world_size"] = o.node.worldSize;
  d["master_addr"] = o.node.masterAddr;
  d["master_port"] = o.node.masterPort;
  d["master_port_chosen"] = o.node.masterPortChosen;
  d["bind_host"] = o.node.van.bindHost;
  d["secret"] = o.node.secret;
  d["timeout_ms"] = static_cast<int64_t>(o.node.timeout.count());
  d["sync_threads"] = o.node.threads;
  d["tcp_rcvbuf"] = o.node.van.receiveBufferBytes;
  d["io_threads"] = o.node.ioThreads;
  d["sum_threads"] = o.node.sumThreads;
  d["send_window"] = o.node.van.sendWindowBytes;
  d["urgent_layers"] = o.node.van.urgentLayers;
  d["host_queue"] = std::string(egressQueueName(o.node.van.egressQueue));
  d["batch"] = o.node.settings.batch;
  d["pair_bytes"] = o.node.settings.pairBytes;
  d["scheme"] = std::string(schemePolicyName(o.node.settings.policy));
  d["wire"] = std::string(wirePrecisionName(o.node.settings.wire));
  d["local_ranks"] = o.node.settings.localRanks;
  d["start_iteration"] = o.node.settings.startIteration;
  d["drop_stragglers"] = o.node.settings.dropStragglers;
  d["straggler_timeout_ms"] = o.node.settings.stragglerTimeoutMs;
  d["overlap"] = o.overlap;
  d["broadcast_buffers"] = o.broadcastBuffers;
  d["check_finite"] = o.checkFinite;
  d["stage_on_host"] = o.stageOnHost;
  // Compute groups (Omnivore; docs/omnivore.md): 0 is BSP. The shards run SGD with this momentum and
  // weight decay; learning_rate is the first round's (the package sets each later round's).
  d["groups"] = o.node.settings.groups;
  d["staleness"] = o.node.settings.staleness;
  d["momentum"] = o.node.settings.momentum;
  d["weight_decay"] = o.node.settings.weightDecay;
  d["learning_rate"] = o.learningRate;
  // Resuming a compute-group checkpoint: the shards' momentum buffers (one float32 tensor per trainable
  // parameter, in the layers' order; empty: zeros) and version clock.
  d["group_momentum"] = py::list();
  d["group_version"] = o.groupVersion;
  return d;
}

pt::DistributedOptions optionsFromDict(const py::dict& d) {
  pt::DistributedOptions o;
  auto get = [&](const char* key) {
    if (!d.contains(key)) throw InvalidArgument(strCat("option '", key, "' is missing"));
    return d[key];
  };
  o.node.rank = get("rank").cast<int>();
  o.node.worldSize = get("world_size").cast<int>();
  o.node.masterAddr = get("master_addr").cast<std::string>();
  o.node.masterPort = get("master_port").cast<int>();
  o.node.masterPortChosen = get("master_port_chosen").cast<bool>();
  o.node.van.bindHost = get("bind_host").cast<std::string>();
  o.node.secret = get("secret").cast<std::string>();
  o.node.timeout = std::chrono::milliseconds(get("timeout_ms").cast<int64_t>());
  o.node.threads = get("sync_threads").cast<int>();
  o.node.van.receiveBufferBytes = get("tcp_rcvbuf").cast<int>();
  o.node.ioThreads = get("io_threads").cast<int>();
  o.node.sumThreads = get("sum_threads").cast<int>();
  o.node.van.sendWindowBytes = get("send_window").cast<int>();
  o.node.van.urgentLayers = get("urgent_layers").cast<int>();
  o.node.van.egressQueue = parseEgressQueue(get("host_queue").cast<std::string>(), "host_queue");
  o.node.settings.batch = get("batch").cast<int64_t>();
  o.node.settings.pairBytes = get("pair_bytes").cast<int64_t>();
  o.node.settings.policy = parseSchemePolicy(get("scheme").cast<std::string>());
  o.node.settings.wire = parseWirePrecision(get("wire").cast<std::string>());
  o.node.settings.localRanks = get("local_ranks").cast<int>();
  o.node.settings.startIteration = get("start_iteration").cast<int64_t>();
  o.node.settings.dropStragglers = get("drop_stragglers").cast<int>();
  o.node.settings.stragglerTimeoutMs = get("straggler_timeout_ms").cast<int64_t>();
  o.overlap = get("overlap").cast<bool>();
  o.broadcastBuffers = get("broadcast_buffers").cast<bool>();
  o.checkFinite = get("check_finite").cast<bool>();
  o.stageOnHost = get("stage_on_host").cast<bool>();
  o.node.settings.groups = get("groups").cast<int>();
  o.node.settings.staleness = get("staleness").cast<int64_t>();
  o.node.settings.momentum = get("momentum").cast<float>();
  o.node.settings.weightDecay = get("weight_decay").cast<float>();
  o.learningRate = get("learning_rate").cast<float>();
  o.groupMomentum = get("group_momentum").cast<std::vector<torch::Tensor>>();
  o.groupVersion = get("group_version").cast<int64_t>();
  if (o.groupVersion < 0) throw InvalidArgument(strCat("group_version must be >= 0, got ", o.groupVersion));
  if (o.node.settings.batch < 1) throw InvalidArgument(strCat("batch must be at least 1, got ", o.node.settings.batch));
  if (o.node.timeout.count() < 1) throw InvalidArgument("timeout must be positive");
  if (o.node.ioThreads < 0 || o.node.ioThreads > 64) {
    throw InvalidArgument(strCat(
        "io_threads must be in [0, 64] (0: half the host's cores per rank on it, 2 to 16), got ", o.node.ioThreads));
  }
  if (o.node.sumThreads < 0 || o.node.sumThreads > 64) {
    throw InvalidArgument(
        strCat("sum_threads must be in [0, 64] (0: the shard sums on the receive loop), got ", o.node.sumThreads));
  }
  if (o.node.van.sendWindowBytes != 0 && o.node.van.sendWindowBytes != VanOptions::kAutoSendWindow &&
      (o.node.van.sendWindowBytes < 4096 || o.node.van.sendWindowBytes > (1 << 30))) {
    throw InvalidArgument(
        strCat("send_window must be 0 (FIFO links), -1 (the runtime's default) or in [4096, "
               "1073741824] bytes, got ",
               o.node.van.sendWindowBytes));
  }
  if (o.node.van.urgentLayers < VanOptions::kAutoUrgentLayers ||
      (o.node.van.urgentLayers > 0 && o.node.van.sendWindowBytes == 0)) {
    throw InvalidArgument(
        strCat("urgent_layers must be >= 0 (or -1: automatic) and needs send_window (priority "
               "links), got ",
               o.node.van.urgentLayers));
  }
  if (o.node.van.receiveBufferBytes < VanOptions::kOsReceiveBuffer) {
    throw InvalidArgument(strCat("tcp_rcvbuf must be >= -1 bytes (0: automatic, -1: the OS default), got ",
                                 o.node.van.receiveBufferBytes));
  }
  return o;
}

LayerType layerTypeOf(const std::string& kind) {
  if (kind == "fc") return LayerType::kFC;
  if (kind == "conv") return LayerType::kConv;
  if (kind == "other") return LayerType::kOther;
  throw InvalidArgument("layer kind '" + kind + "' is not fc, conv or other");
}

// Owns the C++ model; close() ends it (threads stopped) before the interpreter does.
class Model {
 public:
  Model(const std::string& name, const py::list& layers, const std::vector<torch::Tensor>& buffers,
        const std::vector<torch::Tensor>& frozen, const py::dict& options) {
    pt::ModelParts parts;
    parts.name = name;
    for (const auto& item : layers) {
      auto t = item.cast<py::tuple>();
      if (t.size() != 4) throw InvalidArgument("a layer is (name, kind, parameter names, parameters)");
      pt::LayerTensors l;
      l.name = t[0].cast<std::string>();
      l.type = layerTypeOf(t[1].cast<std::string>());
      l.paramNames = t[2].cast<std::vector<std::string>>();
      l.params = t[3].cast<std::vector<torch::Tensor>>();
      if (l.paramNames.size() != l.params.size()) throw InvalidArgument("layer '" + l.name + "': names and tensors differ");
      parts.layers.push_back(std::move(l));
    }
    parts.buffers = buffers;
    parts.frozen = frozen;
    pt::DistributedOptions o = optionsFromDict(options);
    py::gil_scoped_release release;  // the rendezvous waits for the other ranks
    model_ = std::make_unique<pt::DistributedModel>(std::move(parts), std::move(o));
  }

  // Python drops its last reference with the GIL held; the FC server's thread may be waiting for it.
  // In a child forked from the training process (os.fork, then a normal exit) this is a copy: its
  // threads were not forked and its sockets are the parent's, so tearing it down would crash or
  // speak for the rank. The child leaves it to the parent, as its memory goes with the exit.
  ~Model() {
    if (::getpid() != ownerPid_) {
      (void)merged_.release();
      (void)model_.release();
      return;
    }
    py::gil_scoped_release release;
    close();
  }

  pt::DistributedModel& model() {
    if (!model_) throw InvalidArgument("this DistributedModel is closed (finish() or close() was called)");
    return *model_;
  }

  // Merged FC (every rank, after the join): rank 0 starts the FC server, which calls `classifier` (a
  // Python callable over `serverParams`, a copy of the module's classifier `params` that only the
  // server touches; None elsewhere) on its own thread with the GIL taken for the call.
  void startMergedFc(const py::object& classifier, const std::vector<torch::Tensor>& params,
                     const std::vector<torch::Tensor>& serverParams, double momentum, double weightDecay,
                     const std::vector<torch::Tensor>& momentumBuffers) {
    if (merged_) throw InvalidArgument("merged FC already started");
    classifier_ = classifier;
    PyObject* fn = classifier_.ptr();  // kept alive by classifier_ until close() has stopped the thread
    auto call = [fn](torch::Tensor h) {
      py::gil_scoped_acquire gil;
      try {
        return py::reinterpret_borrow<py::object>(fn)(h).cast<torch::Tensor>();
      } catch (py::error_already_set& e) {  // its Python state is released here, with the GIL held
        throw Error(strCat("the classifier raised ", e.what()));
      } catch (py::cast_error&) {
        throw Error("the classifier did not return a tensor");
      }
    };
    py::gil_scoped_release release;
    merged_ =
        std::make_unique<pt::MergedFc>(model(), call, params, momentum, weightDecay, momentumBuffers, serverParams);
  }

  pt::MergedFc& merged() {
    model();  // closed: that error first
    if (!merged_) throw InvalidArgument("this DistributedModel has no FC server (merged_fc=)");
    return *merged_;
  }
  bool hasMergedFc() const { return merged_ != nullptr; }

  // The FC server's thread first: it runs rounds on the node (and may wait for the GIL). Rounds left
  // unserved are not its error: the node tells the peers this rank left.
  void close() {
    merged_.reset();
    model_.reset();
  }
  bool closed() const { return !model_; }

 private:
  std::unique_ptr<pt::DistributedModel> model_;
  const pid_t ownerPid_ = ::getpid();
  py::object classifier_;
  std::unique_ptr<pt::MergedFc> merged_;
};

py::list planOf(pt::DistributedModel& m, int64_t batch) {
  py::list out;
  const auto& used = m.lastSchemes();
  auto plan = m.plan(batch);
  for (size_t l = 0; l < plan.size(); ++l) {
    py::dict d;
    d["name"] = plan[l].name;
    d["type"] = std::string(layerTypeName(plan[l].type));
    d["shape"] = plan[l].shape;
    d["scheme"] = std::string(schemeName(plan[l].scheme));  // BestScheme's choice
    d["last_scheme"] = std::string(schemeName(used[l]));   // what the last step used
    d["floats_per_iteration"] = plan[l].floatsPerIteration;
    out.append(d);
  }
  return out;
}

// The exceptions, as Python classes under poseidon._poseidon. The base first: pybind11 tries the
// translators last-registered first, so the subclasses must come after it to keep their own types.
void defineErrors(py::module_& m) {
  auto base = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<InvalidArgument>(m, "InvalidArgument", base.ptr());
  py::register_exception<TimeoutError>(m, "TimeoutError", base.ptr());
  py::register_exception<AbortedError>(m, "AbortedError", base.ptr());
  py::register_exception<IoError>(m, "IoError", base.ptr());
  py::register_exception<DivergenceError>(m, "DivergenceError", base.ptr());
}

using ModelClass = py::class_<Model>;

// A training step: forward's two halves, the barrier, the overlapped step, straggler dropping.
void defineStep(ModelClass& model) {
  model
      .def(
          "begin_forward", [](Model& s) { s.model().beginForward(); }, py::call_guard<py::gil_scoped_release>())
      .def(
          "end_forward", [](Model& s, const std::vector<torch::Tensor>& outputs) { s.model().endForward(outputs); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "synchronize", [](Model& s) { s.model().synchronize(); }, py::call_guard<py::gil_scoped_release>())
      .def(
          "submit_step", [](Model& s) { s.model().submitStep(); }, py::call_guard<py::gil_scoped_release>())
      .def(
          "finish_layer", [](Model& s, int layer) { s.model().finishLayer(layer); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "finish_step", [](Model& s) { s.model().finishStep(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("step_pending", [](Model& s) { return s.model().stepPending(); })
      .def(
          "skip_if_behind", [](Model& s) { return s.model().skipIfBehind(); }, py::call_guard<py::gil_scoped_release>())
      .def("set_sync_enabled", [](Model& s, bool on) { s.model().setSyncEnabled(on); })
      .def(
          "finish", [](Model& s) { s.model().finish(); }, py::call_guard<py::gil_scoped_release>())
      .def("close", &Model::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &Model::closed)
      .def("note_evaluation_forward", [](Model& s) { s.model().noteEvaluationForward(); })
      .def(
          "fail_job",
          [](Model& s, const std::string& reason) {
            // The package's excepthook: peers stop now with what this rank died of.
            if (!s.closed()) s.model().node().failJob(std::make_exception_ptr(AbortedError(reason)));
          },
          py::arg("reason"), py::call_guard<py::gil_scoped_release>());
}

// Compute groups and merged FC (Omnivore).
void defineGroups(ModelClass& model) {
  model.def("set_group_lr", [](Model& s, float lr) { s.model().setGroupLearningRate(lr); })
      .def(
          "pull_latest", [](Model& s) { s.model().pullLatest(); }, py::call_guard<py::gil_scoped_release>())
      // A compute-group checkpoint; every rank calls it at the same round. (is_first_worker, momentum
      // buffers, version): the first worker's module then holds the shards' parameters. The barrier after
      // the fetch keeps every rank from pushing into the state being read.
      // With merged FC the FC server's momentum buffers come too (on rank 0, the server's; else empty),
      // and rank 0's module takes the server's classifier, both before that barrier: no member has its
      // next round's features out yet.
      .def(
          "group_state",
          [](Model& s) {
            auto [buffers, version] = s.model().groupState();
            std::vector<torch::Tensor> fc;
            if (s.hasMergedFc() && s.merged().server()) {
              fc = s.merged().server()->momentumBuffers();
              s.merged().takeServerClassifier();
            }
            s.model().node().barrier();
            const bool first = s.model().rank() == s.model().node().book().workerRanks().front();
            return std::make_tuple(first, std::move(buffers), version, std::move(fc));
          },
          py::call_guard<py::gil_scoped_release>())
      // Merged FC (Omnivore section V-A; torch/merged_fc.h).
      .def("start_merged_fc", &Model::startMergedFc, py::arg("classifier"), py::arg("params"), py::arg("server_params"),
           py::arg("momentum"), py::arg("weight_decay"), py::arg("momentum_buffers"))
      .def(
          "fc_exchange",
          [](Model& s, const torch::Tensor& h, const torch::Tensor& y, float lr) {
            auto r = s.merged().exchange(h, y, lr);
            return std::make_tuple(r.loss, r.gradient);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "broadcast_classifier", [](Model& s) { s.merged().broadcastClassifier(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "stop_merged_fc", [](Model& s) { s.merged().stop(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("fc_updates",
                             [](Model& s) {
                               auto* server = s.merged().server();
                               return server ? server->updates() : int64_t{-1};
                             })
      .def("staleness_histogram", [](Model& s) { return s.model().node().stalenessHistogram(); })
      .def("max_group_lead", [](Model& s) { return s.model().node().maxGroupLead(); });
}

// What the job is and what it moved.
void defineInfo(ModelClass& model) {
  model.def_property_readonly("rank", [](Model& s) { return s.model().rank(); })
      .def_property_readonly("world_size", [](Model& s) { return s.model().node().book().worldSize(); })
      .def_property_readonly("workers", [](Model& s) { return s.model().workers(); })
      .def("factors_captured", [](Model& s, int layer) { return s.model().factorsCaptured(layer); })
      .def(
          "allsum", [](Model& s, const std::vector<double>& mine) { return s.model().node().allSum(mine); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "plan", [](Model& s, int64_t batch) { return planOf(s.model(), batch); }, py::arg("batch"))
      .def("bytes_sent", [](Model& s) {
        py::dict d;
        auto& c = s.model().node().counters();
        d["ps"] = c.total(TrafficKind::kPS).bytesSent;
        d["sfb"] = c.total(TrafficKind::kSFB).bytesSent;
        d["urgent"] = s.model().node().urgentBytesSent();  // of those, on the urgent connections
        return d;
      });
}

}  // namespace

PYBIND11_MODULE(_poseidon, m) {
  m.doc() = "Poseidon's runtime for PyTorch (see the poseidon package)";
  // A native crash prints the C++ stack (common/crash.h), where no handler is installed yet; the
  // package re-enables Python's faulthandler over it, which chains to this one.
  installCrashReport("poseidon (python)", /*onlyUnhandled=*/true);
  // POSEIDON_LOG, as the poseidon command honours it (a launcher checks it once; its ranks use it). A
  // bad value fails the import with the variable named.
  setLogLevelFromEnvironment();
  defineErrors(m);
  m.def(
      "options_from_environment", [] { return optionsToDict(pt::DistributedOptions::fromEnvironment()); },
      "The launcher's rank, world size, master address and port, bind interface and job secret");

  ModelClass model(m, "Model");
  model.def(py::init<const std::string&, const py::list&, const std::vector<torch::Tensor>&,
                     const std::vector<torch::Tensor>&, const py::dict&>(),
            py::arg("name"), py::arg("layers"), py::arg("buffers"), py::arg("frozen"), py::arg("options"));
  defineStep(model);
  defineGroups(model);
  defineInfo(model);
}
