#include "poseidon/common/device_model.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace poseidon {
namespace {

DeviceModel gModel;
std::atomic<int64_t> gGemmNs{0}, gSumNs{0}, gCryptoNs{0};
std::mutex gCryptoMutex;  // guards gLanes
CryptoLanes gLanes(1);

void hold(double seconds, WorkClock::time_point start, std::atomic<int64_t>& tally) {
  if (seconds <= 0) return;
  auto cost = std::chrono::duration_cast<WorkClock::duration>(std::chrono::duration<double>(seconds));
  tally += std::chrono::duration_cast<std::chrono::nanoseconds>(cost).count();
  std::this_thread::sleep_until(start + cost);
}

}  // namespace

void setDeviceModel(const DeviceModel& model) { gModel = model; }
const DeviceModel& deviceModel() { return gModel; }

void chargeGemm(double scaledFlops, WorkClock::time_point start) {
  if (gModel.gemmFlops > 0) hold(scaledFlops * gModel.flopScale / gModel.gemmFlops, start, gGemmNs);
}

void chargeSum(double scaledBytes, WorkClock::time_point start) {
  if (gModel.sumBytes > 0) hold(scaledBytes * gModel.byteScale / gModel.sumBytes, start, gSumNs);
}

WorkClock::time_point admitCrypto(double scaledBytes, int connection) {
  if (gModel.cryptoBytes <= 0) return WorkClock::time_point::min();
  const auto cost = std::chrono::duration_cast<WorkClock::duration>(
      std::chrono::duration<double>(scaledBytes * gModel.byteScale / gModel.cryptoBytes));
  WorkClock::time_point done;
  {
    std::lock_guard<std::mutex> lock(gCryptoMutex);
    if (gLanes.lanes() != std::max(1, gModel.cryptoLanes)) gLanes = CryptoLanes(gModel.cryptoLanes);
    done = gLanes.admit(WorkClock::now(), cost, connection);  // after the lane's earlier messages
  }
  gCryptoNs += std::chrono::duration_cast<std::chrono::nanoseconds>(cost).count();
  return done;
}

void chargeCrypto(double scaledBytes, int connection) {
  const auto done = admitCrypto(scaledBytes, connection);
  if (done != WorkClock::time_point::min()) std::this_thread::sleep_until(done);
}

ChargedSeconds chargedSeconds() {
  return {gGemmNs.load() * 1e-9, gSumNs.load() * 1e-9, gCryptoNs.load() * 1e-9};
}

}  // namespace poseidon
