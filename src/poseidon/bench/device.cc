#include "poseidon/bench/device.h"

#include <sodium.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "poseidon/bench/emulation.h"
#include "poseidon/common/error.h"
#include "poseidon/kvstore/kv_shard.h"
#include "poseidon/sfb/sufficient_factors.h"

namespace poseidon::bench {
namespace {

template <typename F>
double bestSeconds(int tries, F&& work) {
  double best = 1e30;
  for (int i = 0; i < tries; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    work();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return std::max(best, 1e-9);
}

}  // namespace

MachineRates measureMachineRates() {
  MachineRates r;
  {
    const int64_t m = 1024, n = 1024, k = 256;
    std::vector<float> u(k * m, 1e-3f), v(k * n, 2e-3f), w(m * n), b(m);
    FactorScratch scratch;
    std::vector<FactorView> views{{u.data(), v.data(), k}};
    double s = bestSeconds(3, [&] { reconstructGradient(views, m, n, 1.0f, w.data(), b.data(), &scratch); });
    r.gemmFlops = 2.0 * k * m * n / s;
  }
  {
    // KvShard::push's own work on a round of 16 in-order pushes of a 2 MB pair.
    const size_t len = 2 * 1024 * 1024 / sizeof(float);
    const int pushes = 16;
    std::vector<float> payload(len, 1.0f), sum;
    double s = bestSeconds(3, [&] {
      bool started = false;
      for (int p = 0; p < pushes; ++p) {
        accumulateContribution(sum, started, reinterpret_cast<const uint8_t*>(payload.data()),
                               static_cast<int64_t>(len), WirePrecision::kFp32);
      }
    });
    volatile float sink = sum[len / 2];  // the sums are used: the loop cannot be optimized away
    (void)sink;
    r.sumBytes = pushes * len * sizeof(float) / s;
  }
  {
    if (sodium_init() < 0) throw Error("libsodium failed to initialize");
    const size_t len = 2 * 1024 * 1024;
    std::vector<unsigned char> msg(len, 7), box(len + crypto_secretbox_MACBYTES);
    unsigned char key[crypto_secretbox_KEYBYTES], nonce[crypto_secretbox_NONCEBYTES];
    randombytes_buf(key, sizeof key);
    randombytes_buf(nonce, sizeof nonce);
    double s = bestSeconds(3, [&] { crypto_secretbox_easy(box.data(), msg.data(), len, nonce, key); });
    r.cryptoBytes = len / s;
  }
  return r;
}

DeviceModel deviceFor(const std::string& spec, double scale, const MachineRates& rates) {
  DeviceModel d;
  d.name = spec;
  if (spec == "none") return d;
  d.flopScale = 1.0 / (scale * scale * scale);
  d.byteScale = 1.0 / (scale * scale);
  d.sumBytes = rates.sumBytes;
  d.cryptoBytes = rates.cryptoBytes;
  if (spec == "titanx") {
    d.gemmFlops = kTitanXGemmFlops;
    d.gemmOnGpu = true;
  } else if (spec == "h200" || spec == "h200-bf16") {
    d.gemmFlops = h200SfbGemmFlops();  // the reconstruction runs on fp32 factors in both
    d.gemmOnGpu = true;
  } else if (spec.rfind("cpu:", 0) == 0) {
    char* end = nullptr;
    long cores = std::strtol(spec.c_str() + 4, &end, 10);
    if (spec.size() == 4 || *end != '\0' || cores < 1 || cores > 256) {
      throw InvalidArgument("--compute cpu:C needs a core count C in [1, 256], got '" + spec + "'");
    }
    d.gemmFlops = rates.gemmFlops * static_cast<double>(cores);
  } else {
    throw InvalidArgument("unknown --compute '" + spec + "' (titanx, h200, h200-bf16, cpu:C, none)");
  }
  return d;
}

ComputeChoice parseComputeList(const std::string& list) {
  ComputeChoice c;
  std::string item;
  std::stringstream in(list);
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    deviceFor(item, 1, MachineRates{});  // validates the name
    if (std::find(c.nodes.begin(), c.nodes.end(), item) != c.nodes.end())
      throw InvalidArgument("--compute names '" + item + "' twice");
    if (isComputeName(item)) {
      if (!c.gpu.empty() && c.gpu != item) {
        throw InvalidArgument("--compute names two GPUs, " + c.gpu + " and " + item +
                              "; one run models one GPU's compute (run them separately)");
      }
      c.gpu = item;
    }
    c.nodes.push_back(item);
  }
  if (c.nodes.empty())
    throw InvalidArgument("--compute needs at least one node (titanx, h200, h200-bf16, cpu:C, none)");
  if (c.gpu.empty()) c.gpu = "titanx";
  return c;
}

void ChargedDevice::hold(double seconds, WorkClock::time_point start, std::atomic<int64_t>& tally) {
  if (seconds <= 0) return;
  auto cost = std::chrono::duration_cast<WorkClock::duration>(std::chrono::duration<double>(seconds));
  tally += std::chrono::duration_cast<std::chrono::nanoseconds>(cost).count();
  const auto left = start + cost - WorkClock::now();
  if (left <= WorkClock::duration::zero()) return;
  // A wait below kMinHoldWait is owed by the thread, not slept at once, and paid with its next one
  // that reaches it: a server's sum lane charges thousands of 10-100 us sums a second, and each
  // sleep costs the host a wake-up (4.5% of this 2-core machine, resnet-152 at 8 nodes). The thread's
  // time stays what was charged; one charge's end moves by at most kMinHoldWait.
  thread_local WorkClock::duration owed{};
  owed += left;
  if (owed < kMinHoldWait) return;
  const auto wait = owed;
  owed = WorkClock::duration::zero();
  std::this_thread::sleep_for(wait);
}

void ChargedDevice::chargeGemm(double scaledFlops, WorkClock::time_point start) {
  if (model_.gemmFlops <= 0) return;
  const auto cost = std::chrono::duration_cast<WorkClock::duration>(
      std::chrono::duration<double>(scaledFlops * model_.flopScale / model_.gemmFlops));
  WorkClock::time_point done;
  {
    std::lock_guard<std::mutex> lock(timelineMutex_);
    done = (model_.gemmOnGpu ? gpu_ : gemmCores_).admit(start, cost);  // after the work queued before it
  }
  gemmNs_ += std::chrono::duration_cast<std::chrono::nanoseconds>(cost).count();
  std::this_thread::sleep_until(done);
}

WorkClock::time_point ChargedDevice::compute(WorkClock::time_point start, WorkClock::duration cost) {
  std::lock_guard<std::mutex> lock(timelineMutex_);
  return gpu_.admit(start, cost);
}

void ChargedDevice::chargeSum(double scaledBytes, WorkClock::time_point start) {
  if (model_.sumBytes > 0) hold(scaledBytes * model_.byteScale / model_.sumBytes, start, sumNs_);
}

WorkClock::time_point ChargedDevice::admitCrypto(double scaledBytes, int connection) {
  if (model_.cryptoBytes <= 0) return WorkClock::time_point::min();
  const auto cost = std::chrono::duration_cast<WorkClock::duration>(
      std::chrono::duration<double>(scaledBytes * model_.byteScale / model_.cryptoBytes));
  WorkClock::time_point done;
  {
    std::lock_guard<std::mutex> lock(lanesMutex_);
    done = lanes_.admit(WorkClock::now(), cost, connection);  // after the lane's earlier messages
  }
  cryptoNs_ += std::chrono::duration_cast<std::chrono::nanoseconds>(cost).count();
  return done;
}

void ChargedDevice::chargeCrypto(double scaledBytes, int connection) {
  const auto done = admitCrypto(scaledBytes, connection);
  if (done != WorkClock::time_point::min()) std::this_thread::sleep_until(done);
}

ChargedSeconds ChargedDevice::charged() const {
  return {gemmNs_.load() * 1e-9, sumNs_.load() * 1e-9, cryptoNs_.load() * 1e-9};
}

}  // namespace poseidon::bench
