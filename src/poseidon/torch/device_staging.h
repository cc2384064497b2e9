// How a model's gradients reach the network when they do not live in the host memory the node reads
// (docs/gpu.md): a CUDA model's, or a CPU model's under DistributedOptions::stageOnHost (the tests run
// the GPU's data path that way on machines without one).
//
// Wait-free backpropagation on a device: when a layer's backward is done, toHost() queues the copy of
// its gradient (or its sufficient factors) into host memory on a side stream, ordered after the work
// queued so far on the backward's stream by an event, and returns: backward goes on with the layers
// below while the copy runs. The staging thread waits for each copy's event in turn and then hands the
// host buffer to the node (the `then` of toHost), so the syncer sends once the bytes are on the host.
//
// Written against LibTorch's device-generic API (c10::Device, c10::Stream and c10::Event through the
// virtual guard), so one source compiles against a CPU-only LibTorch and runs on a CUDA build. On the
// CPU the copies are made at once and only `then` goes to the thread.
#pragma once

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "poseidon/common/trace.h"
#include "poseidon/sfb/sufficient_factors.h"

namespace poseidon::pt {

// The device a rank trains on, from what was asked ("cpu", "cuda", or "auto": cuda when there is one)
// and the rank's LOCAL_RANK (poseidon launch, torchrun, Slurm): one process per GPU, cuda:LOCAL_RANK.
// Ranks beyond the node's GPUs share them round-robin (cuda:LOCAL_RANK mod the count). Throws
// InvalidArgument for another name, or for "cuda" where LibTorch sees no CUDA device.
c10::Device selectDevice(const std::string& want, int localRank, int cudaDevices);
// The same with this process's CUDA device count.
c10::Device selectDevice(const std::string& want, int localRank);

// An SFB layer's mean gradient rebuilt on the device from every worker's factors (DeviceStaging::rebuild).
struct DeviceRebuild {
  torch::Tensor result;                // on the device: weight (m x n) then bias (m), flat
  std::optional<c10::Event> done;      // recorded on the rebuild stream after the GEMM
  std::optional<c10::Event> consumed;  // recorded after takeRebuilt's copies: the next rebuild waits for it
  bool fresh = false;                  // rebuilt this step, not yet taken into .grad()
};

class DeviceStaging {
 public:
  // `onFailure` runs on the staging thread when a `then` throws (the model fails the job with it).
  DeviceStaging(c10::Device device, std::function<void(std::exception_ptr)> onFailure);
  // Waits for the copies in flight (their host buffers may go next); `then`s not yet run are dropped.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  const c10::Device& device() const { return device_; }
  // A host tensor of `n` elements of `dtype`: page-locked for a CUDA device (what an asynchronous copy
  // needs), ordinary memory for the CPU.
  torch::Tensor hostTensor(int64_t n, torch::ScalarType dtype = torch::kFloat32) const;

  // Copies src[i] (on the device) into dst[i] (host, same number of elements), after the work queued
  // so far on the current stream, then runs `then` on the staging thread once every byte is on the
  // host. The sources stay referenced until then. `traceName`: the copy's span on the tracer's
  // "device" lane (from queueing to completion), when a tracer is set.
  void toHost(std::vector<torch::Tensor> src, std::vector<torch::Tensor> dst, std::function<void()> then,
              std::string traceName = {}, int64_t iteration = -1);
  // Waits until every `then` queued so far has run. Throws the first one's failure.
  void drain();
  // Host to device, after the work queued so far on the current stream and before what follows it
  // there (non-blocking from page-locked memory). dst and src have the same number of elements.
  static void fromHost(const torch::Tensor& dst, const torch::Tensor& src);
  // Blocks until the work queued so far on `device`'s current stream is done (nothing on the CPU): the
  // host buffers that fromHost() copies read may then be written again.
  static void waitForCurrentStream(const c10::Device& device);

  // SFB for a CUDA layer: scale * sum over workers of U^T V (and the bias, scale * the column sums of
  // U) as one GEMM on the device (cuBLAS through LibTorch) into `into.result`. The workers' host factors
  // go up in one page-locked buffer each for U and V; the work runs on a rebuild stream of its own and
  // `into.done` marks its end. Called on a pool thread (Node::submitFactors' FactorRebuild).
  void rebuild(const std::vector<FactorView>& workers, int64_t m, int64_t n, bool bias, float scale,
               DeviceRebuild& into);
  // The rebuilt mean into each parameter's .grad() (`grads`: weight, then bias), after the current
  // stream waits for the rebuild: device to device, nothing on the host.
  static void takeRebuilt(DeviceRebuild& from, const std::vector<torch::Tensor>& grads);

  void setTracer(Tracer* tracer) { tracer_ = tracer; }

 private:
  struct Job;
  void loop();

  const c10::Device device_;
  const std::function<void(std::exception_ptr)> onFailure_;
  std::optional<c10::Stream> copyStream_;     // a device's side stream for the copies down (none for the CPU)
  std::optional<c10::Stream> rebuildStream_;  // and one for the SFB rebuilds
  Tracer* tracer_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;  // work queued, or a job done
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t queued_ = 0, done_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace poseidon::pt
