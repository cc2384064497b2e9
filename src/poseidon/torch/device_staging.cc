#include "poseidon/torch/device_staging.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/torch/compat.h"

namespace poseidon::pt {

c10::Device selectDevice(const std::string& want, int localRank, int cudaDevices) {
  if (want != "cpu" && want != "cuda" && want != "auto") {
    throw InvalidArgument(strCat("--device must be cpu, cuda or auto, got '", want, "'"));
  }
  if (want == "cpu" || (want == "auto" && cudaDevices == 0)) return c10::Device(c10::kCPU);
  if (cudaDevices == 0) {
    throw InvalidArgument(
        "--device cuda: LibTorch sees no CUDA device here (a CPU-only build, or no GPU visible); use --device cpu");
  }
  if (localRank < 0) throw InvalidArgument(strCat("LOCAL_RANK must be at least 0, got ", localRank));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(localRank % cudaDevices));
}

c10::Device selectDevice(const std::string& want, int localRank) {
  return selectDevice(want, localRank, static_cast<int>(torch::cuda::device_count()));
}

struct DeviceStaging::Job {
  std::vector<torch::Tensor> src;  // referenced until the copy is done
  std::optional<c10::Event> done;  // recorded on the side stream after the copies (none on the CPU)
  std::function<void()> then;
  std::string traceName;
  int64_t iteration = -1;
  int64_t startUs = 0;
};

DeviceStaging::DeviceStaging(c10::Device device, std::function<void(std::exception_ptr)> onFailure)
    : device_(device), onFailure_(std::move(onFailure)) {
  if (!device_.is_cpu()) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    copyStream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    rebuildStream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  }
  thread_ = std::thread([this] { loop(); });
}

DeviceStaging::~DeviceStaging() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

torch::Tensor DeviceStaging::hostTensor(int64_t n, torch::ScalarType dtype) const {
  return torch::empty({n}, torch::TensorOptions().dtype(dtype).pinned_memory(!device_.is_cpu()));
}

void DeviceStaging::toHost(std::vector<torch::Tensor> src, std::vector<torch::Tensor> dst, std::function<void()> then,
                           std::string traceName, int64_t iteration) {
  POSEIDON_ENFORCE_EQ(src.size(), dst.size(), "device-to-host copies: sources and destinations");
  auto job = std::make_shared<Job>();
  job->then = std::move(then);
  job->traceName = std::move(traceName);
  job->iteration = iteration;
  job->startUs = tracer_ ? Tracer::nowMicros() : 0;
  torch::NoGradGuard noGrad;
  if (copyStream_) {
    // The copies wait for what the backward queued so far (this layer's gradient), not for what it
    // queues next: the layers below compute while the copy engine moves this one.
    c10::impl::VirtualGuardImpl impl(device_.type());
    c10::Event ready(device_.type());
    ready.record(impl.getStream(device_));
    ready.block(*copyStream_);
    {
      c10::StreamGuard onCopyStream(*copyStream_);
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i].view(dst[i].sizes()), /*non_blocking=*/true);
    }
    job->done.emplace(device_.type());
    job->done->record(*copyStream_);
    job->src = std::move(src);
  } else {
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i].view(dst[i].sizes()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(job));
    ++queued_;
  }
  cv_.notify_all();
}

void DeviceStaging::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t target = queued_;
  cv_.wait(lock, [&] { return done_ >= target; });
  if (failure_) std::rethrow_exception(failure_);
}

void DeviceStaging::fromHost(const torch::Tensor& dst, const torch::Tensor& src) {
  torch::NoGradGuard noGrad;
  // From page-locked memory a device copy is asynchronous on the current stream: the step that
  // follows there (the optimizer) sees it, and the host goes on.
  dst.copy_(src.view(dst.sizes()), /*non_blocking=*/!dst.device().is_cpu());
}

void DeviceStaging::waitForCurrentStream(const c10::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::Event done(device.type());
  done.record(impl.getStream(device));
  eventSynchronize(done);
}

void DeviceStaging::rebuild(const std::vector<FactorView>& workers, int64_t m, int64_t n, bool bias, float scale,
                            DeviceRebuild& into) {
  int64_t rows = 0;
  for (const auto& w : workers) rows += w.rows;
  torch::Tensor u = hostTensor(rows * m), v = hostTensor(rows * n);
  float *pu = u.data_ptr<float>(), *pv = v.data_ptr<float>();
  for (const auto& w : workers) {  // stacked in the workers' order, as reconstructGradient stacks them
    std::memcpy(pu, w.u, static_cast<size_t>(w.rows * m) * sizeof(float));
    std::memcpy(pv, w.v, static_cast<size_t>(w.rows * n) * sizeof(float));
    pu += w.rows * m;
    pv += w.rows * n;
  }
  torch::NoGradGuard noGrad;
  auto compute = [&] {
    torch::Tensor du = u.view({rows, m}).to(device_, /*non_blocking=*/true);
    torch::Tensor dv = v.view({rows, n}).to(device_, /*non_blocking=*/true);
    torch::Tensor w = into.result.narrow(0, 0, m * n).view({m, n});
    torch::mm_out(w, du.t(), dv);
    w.mul_(scale);
    if (bias) {
      into.result.narrow(0, m * n, m).copy_(du.sum(0)).mul_(scale);
    }
  };
  if (rebuildStream_) {
    // Not over the result before the last step's copies out of it ran (straggler dropping may rebuild
    // a round without this worker's factors, so nothing else orders the two).
    if (into.consumed) into.consumed->block(*rebuildStream_);
    // Nor before what the device's stream holds now: the node held this GEMM until the backward was
    // handed over (NodeOptions::deferReconstruction), so it runs after the backward's kernels, in the
    // wait for the lowest layer's sync, instead of sharing the GPU with them. This thread's stream is
    // the device's default one: a backward run on a stream of the user's own is not waited for (the
    // GEMM then shares the GPU with it, as before the hold).
    c10::impl::VirtualGuardImpl impl(device_.type());
    c10::Event queued(device_.type());
    queued.record(impl.getStream(device_));
    queued.block(*rebuildStream_);
    c10::StreamGuard onRebuildStream(*rebuildStream_);
    compute();
    into.done.emplace(device_.type());
    into.done->record(*rebuildStream_);
  } else {
    compute();
  }
  into.fresh = true;
}

void DeviceStaging::takeRebuilt(DeviceRebuild& from, const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard noGrad;
  const c10::Device device = from.result.device();
  std::optional<c10::Stream> current;
  if (!device.is_cpu()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    current = impl.getStream(device);
    if (from.done) from.done->block(*current);
  }
  int64_t off = 0;
  for (const auto& g : grads) {
    g.copy_(from.result.narrow(0, off, g.numel()).view(g.sizes()));
    off += g.numel();
  }
  if (current) {
    from.consumed.emplace(device.type());
    from.consumed->record(*current);
  }
  from.fresh = false;
}

void DeviceStaging::loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every copy in flight is done
      job = queue_.front();
    }
    // Copies complete in the order they were queued (one side stream), so waiting in turn is exact.
    if (job->done) eventSynchronize(*job->done);
    job->src.clear();
    if (tracer_ && !job->traceName.empty()) {
      tracer_->span(job->traceName, "device", 3, job->startUs, Tracer::nowMicros(), job->iteration);
    }
    bool run;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      run = !stop_ && !failure_;
    }
    if (run) {
      try {
        job->then();
      } catch (...) {
        std::exception_ptr e = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(mutex_);
          failure_ = e;
        }
        if (onFailure_) onFailure_(e);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.pop_front();
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace poseidon::pt
