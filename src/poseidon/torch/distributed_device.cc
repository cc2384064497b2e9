// DistributedModel's device path (docs/gpu.md): which device a model lives on, and how a CUDA model's
// tensors (or a CPU model's under stageOnHost) go through host buffers: the broadcasts, and each
// layer's gradient or factors on their way to the node (torch/device_staging.h). The in-place CPU path
// is distributed.cc.
#include <cstring>
#include <optional>

#include "poseidon/common/error.h"
#include "poseidon/torch/device_staging.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/distributed_layer.h"

namespace poseidon::pt {

namespace {
// A tensor's bytes as floats, for broadcasting them bit for bit (buffers may be int64, as
// BatchNorm's num_batches_tracked is). Empty when the tensor cannot be sent in place.
std::optional<FloatSpan> bytesAsFloats(const torch::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous() || t.nbytes() % sizeof(float) != 0) {
    return std::nullopt;
  }
  return FloatSpan{static_cast<float*>(t.data_ptr()), static_cast<int64_t>(t.nbytes() / sizeof(float))};
}

// Whether a tensor goes through host copies whole, as floats' worth of bytes.
bool wholeFloats(const torch::Tensor& t) { return t.defined() && t.nbytes() % sizeof(float) == 0; }

}  // namespace

c10::Device modelDevice(const ModelParts& parts) {
  std::optional<c10::Device> device;
  std::string first;
  for (const auto& l : parts.layers) {
    for (const auto& p : l.params) {
      if (p.scalar_type() != torch::kFloat32) {
        throw InvalidArgument(strCat("Poseidon synchronizes float32 parameters (autocast keeps them float32); model '",
                                     parts.name, "' has a ", c10::toString(p.scalar_type()), " parameter on ",
                                     p.device().str(), " (layer '", l.name, "')"));
      }
      if (p.numel() == 0) {  // the coordinator said "malformed join message: layer 0 has a bad dimension 0"
        throw InvalidArgument(strCat("model '", parts.name, "' has a parameter with no elements (shape ", p.sizes(),
                                     ", layer '", l.name, "'): freeze it (requires_grad false) or drop it"));
      }
      if (!device) {
        device = p.device();
        first = l.name;
      } else if (p.device() != *device) {
        throw InvalidArgument(strCat("model '", parts.name, "' has parameters on ", device->str(), " (layer '", first,
                                     "') and on ", p.device().str(), " (layer '", l.name,
                                     "'): Poseidon synchronizes a model on one device (one process per GPU)"));
      }
    }
  }
  if (!device) return c10::Device(c10::kCPU);
  if (!device->is_cpu() && !device->is_cuda()) {
    throw InvalidArgument(strCat("model '", parts.name, "' has its parameters on ", device->str(),
                                 ": Poseidon synchronizes models on the CPU or one CUDA device"));
  }
  return *device;
}

bool broadcastable(const torch::Tensor& t, bool /*staged*/) { return t.defined() && t.numel() > 0; }

void DistributedModel::broadcastTensors(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard guard;
  // Each tensor travels as whole floats: in place (a contiguous CPU tensor of whole floats' bytes:
  // float32 and int64 alike), through a pinned host buffer (the staged path), or, when its bytes are
  // not whole floats (a bool or uint8 buffer of 3 elements), through a host copy padded to them. Such
  // buffers used to be left out without a word: every rank kept its own.
  struct Copy {
    size_t index;
    torch::Tensor host;  // what travels
    torch::Tensor bytes;  // padded path: the tensor's bytes on the host (may be the tensor itself)
  };
  std::vector<FloatSpan> spans;
  std::vector<Copy> copies;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!staging_) {
      if (auto span = bytesAsFloats(t)) {
        spans.push_back(*span);
        continue;
      }
    }
    Copy c{i, {}, {}};
    if (staging_ && wholeFloats(t)) {
      c.host = staging_->hostTensor(t.numel(), t.scalar_type());
      c.host.copy_(t.reshape(-1));
    } else {
      c.bytes = t.contiguous().to(torch::kCPU);
      const size_t n = c.bytes.nbytes();
      c.host = torch::zeros({static_cast<int64_t>((n + sizeof(float) - 1) / sizeof(float))}, torch::kFloat32);
      std::memcpy(c.host.data_ptr(), c.bytes.data_ptr(), n);
    }
    spans.push_back({static_cast<float*>(c.host.data_ptr()), static_cast<int64_t>(c.host.nbytes() / sizeof(float))});
    copies.push_back(std::move(c));
  }
  node_->broadcast(0, LayerBuffer(spans));
  for (Copy& c : copies) {
    const torch::Tensor& t = tensors[c.index];
    if (!c.bytes.defined()) {
      t.copy_(c.host.view(t.sizes()));
      continue;
    }
    std::memcpy(c.bytes.data_ptr(), c.host.data_ptr(), c.bytes.nbytes());
    if (!c.bytes.is_same(t)) t.copy_(c.bytes.view(t.sizes()));
  }
}

void DistributedModel::broadcastBuffers() {
  // Straggler mode: a per-step broadcast would make rank 0 everyone's pace-setter again, so
  // buffers are left to each rank there (docs/torch.md).
  if (solo_ || !options_.broadcastBuffers || buffers_.empty() || node_->book().settings().stragglerMode()) return;
  broadcastTensors(buffers_);
}

void DistributedModel::stageGradient(int layer, std::function<void(LayerBuffer)> submit) {
  Layer& l = layers_[layer];
  std::vector<torch::Tensor> grads;
  for (auto& p : l.params) grads.push_back(p.grad());
  staging_->toHost(
      std::move(grads), perParameter(l.host, l.params),
      [this, layer, submit = std::move(submit)] {
        const torch::Tensor& host = layers_[layer].host;
        submit(LayerBuffer::contiguous(host.data_ptr<float>(), host.numel()));
      },
      tracer_ ? "copy " + l.spec->name + " to host" : std::string(), iteration_);
}

// The same for its sufficient factors: U and V go to host buffers of their own. A CUDA layer's mean
// gradient is rebuilt on its device (layer.rebuilt); a CPU layer's lands in its host staging buffer.
void DistributedModel::submitFactorsStaged(int layer, const std::shared_ptr<void>& keep) {
  Layer& l = layers_[layer];
  struct Host {
    std::shared_ptr<void> device;  // U and V on the device, until the copy is done
    torch::Tensor u, v;
  };
  auto host = std::make_shared<Host>(Host{keep, staging_->hostTensor(l.u.numel()), staging_->hostTensor(l.v.numel())});
  const int64_t rows = l.u.size(0);
  // A CUDA layer rebuilds on its device (a GEMM through LibTorch); a CPU one by the host's Eigen GEMM
  // into the staging buffer.
  FactorRebuild rebuild;
  if (l.rebuilt.result.defined()) {
    const int64_t m = l.spec->m, n = l.spec->n;
    const bool bias = l.params.size() > 1;
    rebuild = [this, layer, m, n, bias](const std::vector<FactorView>& workers, float scale) {
      staging_->rebuild(workers, m, n, bias, scale, layers_[layer].rebuilt);
    };
  }
  staging_->toHost(
      {l.u, l.v}, {host->u.view(l.u.sizes()), host->v.view(l.v.sizes())},
      [this, layer, host, rows, rebuild] {
        const torch::Tensor& staging = layers_[layer].staging;
        node_->submitFactors(layer, host->u.data_ptr<float>(), host->v.data_ptr<float>(), rows,
                             LayerBuffer::contiguous(staging.data_ptr<float>(), staging.numel()), host, rebuild);
      },
      tracer_ ? "copy " + l.spec->name + " factors to host" : std::string(), iteration_);
}

}  // namespace poseidon::pt
