// The device model: what `poseidon bench --compute` charges (bench::ChargedDevice) for the runtime's
// own work at full width, and how its names parse. The charging inside a
// real multi-process run is covered by integration/bench_smoke_test.cc.
#include "poseidon/common/device_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "poseidon/bench/device.h"
#include "poseidon/bench/emulation.h"
#include "poseidon/common/error.h"
#include "poseidon/common/work_charger.h"
#include "poseidon/core/best_scheme.h"
#include "poseidon/model/zoo.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;

TEST(DeviceModel, ChargeHoldsTheCallerForTheFullWidthCost) {
  DeviceModel m;
  m.flopScale = 1000;  // s = 0.1
  m.byteScale = 100;
  m.gemmFlops = 1e12;
  m.sumBytes = 1e9;
  m.cryptoBytes = 1e9;
  bench::ChargedDevice device(m);
  bench::ChargedSeconds before = device.charged();
  auto start = WorkClock::now();
  device.chargeGemm(5e7, start);  // 5e10 FLOPs at full width / 1e12 FLOP/s = 50 ms
  double held = std::chrono::duration<double>(WorkClock::now() - start).count();
  EXPECT_GE(held, 0.05);
  device.chargeSum(2e5, WorkClock::now());  // 2e7 bytes / 1e9 = 20 ms
  device.chargeCrypto(1e5, 3);              // 1e7 bytes / 1e9 = 10 ms
  bench::ChargedSeconds after = device.charged();
  EXPECT_NEAR(after.gemm - before.gemm, 0.05, 1e-6);
  EXPECT_NEAR(after.sum - before.sum, 0.02, 1e-6);
  EXPECT_NEAR(after.crypto - before.crypto, 0.01, 1e-6);
}

// Each connection's encryption queues on one of the I/O threads' timelines.
TEST(DeviceModel, CryptoLanesQueuePerIoThread) {
  using bench::CryptoLanes;
  using std::chrono::milliseconds;
  const WorkClock::time_point t0{};
  CryptoLanes one(1);
  EXPECT_EQ(one.admit(t0, milliseconds(50), 0), t0 + milliseconds(50));
  EXPECT_EQ(one.admit(t0, milliseconds(50), 1), t0 + milliseconds(100));  // one I/O thread: behind the first
  EXPECT_EQ(one.admit(t0 + milliseconds(300), milliseconds(10), 7), t0 + milliseconds(310));  // idle by then
  CryptoLanes two(2);
  EXPECT_EQ(two.lanes(), 2);
  EXPECT_EQ(two.admit(t0, milliseconds(50), 0), t0 + milliseconds(50));
  EXPECT_EQ(two.admit(t0, milliseconds(50), 1), t0 + milliseconds(50));   // the other thread: at once
  EXPECT_EQ(two.admit(t0, milliseconds(50), 2), t0 + milliseconds(100));  // connection 2 shares lane 0
  EXPECT_EQ(CryptoLanes(0).lanes(), 1);
}

TEST(DeviceModel, WorkThatAlreadyTookLongerIsChargedItsCostOnly) {
  DeviceModel m;
  m.gemmFlops = 1e9;
  bench::ChargedDevice device(m);
  bench::ChargedSeconds before = device.charged();
  device.chargeGemm(1e6, WorkClock::now() - std::chrono::seconds(10));  // 1 ms of work that took 10 s: no wait
  EXPECT_NEAR(device.charged().gemm - before.gemm, 0.001, 1e-9);
}

// Short waits are owed per thread, not slept one by one (each sleep costs the host a wake-up), and
// none is lost: a run of small sums holds the thread for all of them but what is still owed, less
// than kMinHoldWait.
TEST(DeviceModel, ShortWaitsAreOwedAndPaidInFull) {
  DeviceModel m;
  m.sumBytes = 1e9;
  bench::ChargedDevice device(m);
  const auto wait = bench::ChargedDevice::kMinHoldWait;
  const double each = std::chrono::duration<double>(wait).count() / 4;  // a quarter of the threshold
  const auto start = WorkClock::now();
  for (int i = 0; i < 40; ++i) device.chargeSum(each * 1e9, WorkClock::now());  // `each` seconds at 1e9 bytes/s
  // 40 quarters are 10 thresholds: all paid but what is still owed.
  EXPECT_GE(WorkClock::now() - start, 9 * wait);
  EXPECT_NEAR(device.charged().sum, 10 * std::chrono::duration<double>(wait).count(), 1e-9);
  // A wait past the threshold is slept at once (twice it: what is left of it when it is charged still is).
  const auto big = WorkClock::now();
  device.chargeSum(2 * std::chrono::duration<double>(wait).count() * 1e9, big);
  EXPECT_GE(WorkClock::now() - big, wait);
}

// The default model charges nothing, and neither does the runtime without a charger (production).
TEST(DeviceModel, TheDefaultChargesNothing) {
  bench::ChargedDevice device(DeviceModel{});
  bench::ChargedSeconds before = device.charged();
  device.chargeGemm(1e15, WorkClock::now());
  device.chargeSum(1e15, WorkClock::now());
  device.chargeCrypto(1e15, 0);
  bench::ChargedSeconds after = device.charged();
  EXPECT_EQ(after.gemm, before.gemm);
  EXPECT_EQ(after.sum, before.sum);
  EXPECT_EQ(after.crypto, before.crypto);
  EXPECT_FALSE(DeviceModel{}.charges());
  EXPECT_FALSE(device.chargesCrypto());
  EXPECT_EQ(device.admitCrypto(1e15, 0), WorkClock::time_point::min());
  const auto start = WorkClock::now();
  chargeGemm(nullptr, 1e15, start - std::chrono::hours(1));  // would be held for ages if it charged anything
  chargeSum(nullptr, 1e15, start - std::chrono::hours(1));
  EXPECT_LT(WorkClock::now() - start, std::chrono::hours(1));
}

TEST(DeviceModel, BenchDeviceNames) {
  bench::MachineRates rates{50e9, 10e9, 1.5e9};
  DeviceModel gpu = bench::deviceFor("titanx", 0.1, rates);
  EXPECT_EQ(gpu.gemmFlops, bench::kTitanXGemmFlops);
  EXPECT_TRUE(gpu.gemmOnGpu);
  EXPECT_EQ(gpu.sumBytes, 10e9);
  EXPECT_EQ(gpu.cryptoBytes, 1.5e9);
  EXPECT_NEAR(gpu.flopScale, 1000, 1e-9);
  EXPECT_NEAR(gpu.byteScale, 100, 1e-9);
  for (const char* h200 : {"h200", "h200-bf16"}) {
    const DeviceModel d = bench::deviceFor(h200, 0.1, rates);
    EXPECT_EQ(d.gemmFlops, bench::h200SfbGemmFlops()) << h200;  // fp32 factors in both
    EXPECT_TRUE(d.gemmOnGpu) << h200;
  }
  EXPECT_GT(bench::h200SfbGemmFlops(), 30e12);  // the file's fp32 shapes run at 30-53 TFLOP/s
  EXPECT_LT(bench::h200SfbGemmFlops(), 54e12);
  EXPECT_EQ(bench::deviceFor("cpu:16", 0.1, rates).gemmFlops, 16 * 50e9);
  EXPECT_FALSE(bench::deviceFor("cpu:16", 0.1, rates).gemmOnGpu);
  EXPECT_FALSE(bench::deviceFor("none", 0.1, rates).charges());
  for (const char* bad : {"cpu:0", "cpu:", "cpu:2x", "cpu:999"}) {
    try {
      bench::deviceFor(bad, 0.1, rates);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("core count C in [1, 256]")) << bad;
    }
  }
  for (const char* bad : {"tpu", "gpu"}) {  // gpu: the name before --compute
    try {
      bench::deviceFor(bad, 0.1, rates);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr(std::string("unknown --compute '") + bad + "' (titanx, h200, h200-bf16, cpu:C, none)"));
    }
  }
}

// --compute's list: one GPU for every system, the nodes Poseidon's work is charged on in order.
TEST(DeviceModel, ComputeListNamesOneGpu) {
  bench::ComputeChoice c = bench::parseComputeList("h200,cpu:1,none");
  EXPECT_EQ(c.gpu, "h200");
  EXPECT_EQ(c.nodes, (std::vector<std::string>{"h200", "cpu:1", "none"}));
  c = bench::parseComputeList("cpu:4");
  EXPECT_EQ(c.gpu, "titanx");  // no GPU named: the paper's
  EXPECT_EQ(c.nodes, std::vector<std::string>{"cpu:4"});
  auto rejected = [](const std::string& list, const std::string& why) {
    try {
      bench::parseComputeList(list);
      ADD_FAILURE() << list << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr(why)) << list;
    }
  };
  rejected("titanx,h200", "--compute names two GPUs, titanx and h200; one run models one GPU's compute");
  rejected("h200,h200", "--compute names 'h200' twice");
  rejected(",", "--compute needs at least one node");
  rejected("h200,tpu", "unknown --compute 'tpu'");
}

// One stream: work queues behind what was admitted before it, and an idle timeline starts it at once.
TEST(DeviceModel, TimelineServesInOrder) {
  using std::chrono::milliseconds;
  const WorkClock::time_point t0{};
  bench::DeviceTimeline gpu;
  EXPECT_EQ(gpu.admit(t0, milliseconds(30)), t0 + milliseconds(30));                      // a layer
  EXPECT_EQ(gpu.admit(t0 + milliseconds(10), milliseconds(5)), t0 + milliseconds(35));    // a GEMM behind it
  EXPECT_EQ(gpu.admit(t0 + milliseconds(30), milliseconds(30)), t0 + milliseconds(65));   // the next layer waits
  EXPECT_EQ(gpu.admit(t0 + milliseconds(100), milliseconds(1)), t0 + milliseconds(101));  // idle by then
}

// On a GPU node the reconstruction delays the emulated layers after it; on cpu:C it does not, but
// two reconstructions share the C cores one after the other.
TEST(DeviceModel, TheGemmRunsOnTheGpusTimelineOrTheCoresOne) {
  using std::chrono::milliseconds;
  DeviceModel m;
  m.gemmFlops = 1e12;  // 1e10 FLOPs: 10 ms
  m.gemmOnGpu = true;
  {
    bench::ChargedDevice gpu(m);
    const auto start = WorkClock::now();
    gpu.chargeGemm(1e10, start);
    EXPECT_GE(gpu.compute(start, milliseconds(20)), start + milliseconds(30));  // after the GEMM
  }
  m.gemmOnGpu = false;
  bench::ChargedDevice cores(m);
  const auto start = WorkClock::now();
  const auto layerEnd = cores.compute(start, milliseconds(20));
  EXPECT_EQ(layerEnd, start + milliseconds(20));
  std::thread other([&] { cores.chargeGemm(1e10, start); });
  cores.chargeGemm(1e10, start);
  other.join();
  EXPECT_GE(WorkClock::now(), start + milliseconds(20));                            // the second waited for the first
  EXPECT_EQ(cores.compute(layerEnd, milliseconds(5)), layerEnd + milliseconds(5));  // the GPU never waited
}

// vgg19's fc6 at full width, 8 workers and 8 servers, K = 32: SFB saves 1.4 GB of
// PS traffic per node for a 52.6 GFLOP reconstruction.
TEST(DeviceModel, BestSchemeWeighsTheReconstructionAgainstTheBytes) {
  ModelDesc vgg = zooModel("vgg19");
  const LayerSpec* fc6 = nullptr;
  for (const auto& l : vgg.layers)
    if (l.name == "fc6") fc6 = &l;
  ASSERT_NE(fc6, nullptr);
  DeviceModel d;
  d.linkBytes = 10e9 / 8;  // 10 GbE
  d.gemmFlops = 77.6e9;    // one core of this CPU
  d.sumBytes = 22e9;
  SchemeSeconds t = schemeSeconds(*fc6, 32, 8, 8, d);
  // PS: 2 M N (P1 + P2 - 2) / P2 floats over a full-duplex link, plus this shard's sums.
  const double mn = 25088.0 * 4096;
  EXPECT_NEAR(t.ps, 2 * mn * 14 / 8 * 4 / 2 / d.linkBytes + 8 * mn / 8 * 4 / d.sumBytes, 1e-9);
  // SFB: 2 K (P1 - 1)(M + N) floats, plus the GEMM of 2 K P1 M N FLOPs.
  EXPECT_NEAR(t.sfb, 2 * 32 * 7 * (25088.0 + 4096) * 4 / 2 / d.linkBytes + 2 * 32 * 8 * mn / d.gemmFlops, 1e-9);
  EXPECT_EQ(bestScheme(*fc6, 32, 8, 8, SchemePolicy::kAuto, &d), Scheme::kPS);  // 0.70 s of SFB vs 0.60 s of PS
  d.gemmFlops = 5e12;                                                            // a Titan X reconstructs
  EXPECT_EQ(bestScheme(*fc6, 32, 8, 8, SchemePolicy::kAuto, &d), Scheme::kSFB);
  d.gemmFlops = 77.6e9;
  d.linkBytes = 3e9 / 8;  // 3 Gbit/s: the bytes dominate again
  EXPECT_EQ(bestScheme(*fc6, 32, 8, 8, SchemePolicy::kAuto, &d), Scheme::kSFB);
  d.linkBytes = 10e9 / 8;
  d.cryptoBytes = 1.74e9;  // encrypting PS's 1.4 GB costs more than the GEMM
  EXPECT_EQ(bestScheme(*fc6, 32, 8, 8, SchemePolicy::kAuto, &d), Scheme::kSFB);
  // Without a link rate the paper's byte rule decides, whatever the GEMM rate.
  d.linkBytes = 0;
  d.gemmFlops = 1;
  EXPECT_EQ(bestScheme(*fc6, 32, 8, 8, SchemePolicy::kAuto, &d), Scheme::kSFB);
  EXPECT_EQ(schemeSeconds(*fc6, 32, 8, 8, d).ps, 0);
}

// A 16-bit wire halves both schemes' bytes but not the GEMM: at 5 Gbit/s on one CPU core fc6 goes
// by SFB with fp32 (1.17 s of PS vs 0.72 s) and by PS with bf16 (0.59 s vs 0.70 s).
TEST(DeviceModel, BestSchemeCountsTheWiresBytesPerFloat) {
  ModelDesc vgg = zooModel("vgg19");
  const LayerSpec& fc6 = vgg.layers[vgg.find("fc6")];
  DeviceModel d;
  d.linkBytes = 5e9 / 8;
  d.gemmFlops = 77.6e9;
  d.sumBytes = 22e9;
  const double mn = 25088.0 * 4096;
  SchemeSeconds t = schemeSeconds(fc6, 32, 8, 8, d, 2);
  EXPECT_NEAR(t.ps, 2 * mn * 14 / 8 * 2 / 2 / d.linkBytes + 8 * mn / 8 * 4 / d.sumBytes, 1e-9);  // sums stay fp32
  EXPECT_NEAR(t.sfb, 2 * 32 * 7 * (25088.0 + 4096) * 2 / 2 / d.linkBytes + 2 * 32 * 8 * mn / d.gemmFlops, 1e-9);
  EXPECT_EQ(bestScheme(fc6, 32, 8, 8, SchemePolicy::kAuto, &d), Scheme::kSFB);
  EXPECT_EQ(bestScheme(fc6, 32, 8, 8, SchemePolicy::kAuto, &d, 2), Scheme::kPS);
  // Without a device model the byte rule decides, and halving both sides changes nothing.
  EXPECT_EQ(bestScheme(fc6, 32, 8, 8, SchemePolicy::kAuto, nullptr, 2), bestScheme(fc6, 32, 8, 8));
}

// The bench decides on a model scaled by s = 0.1 (K = 3 of 32), with full-width scales and the
// full-width link rate (the emulated one is slowed by s^2): it must time fc6 as the full model does.
TEST(DeviceModel, BestSchemeOnTheScaledModelTimesTheFullWidthOne) {
  auto fc6Of = [](const ModelDesc& m) {
    for (const auto& l : m.layers)
      if (l.name == "fc6") return l;
    throw Error("no fc6");
  };
  LayerSpec full = fc6Of(zooModel("vgg19")), scaled = fc6Of(zooModel("vgg19", 0.1));
  DeviceModel d;
  d.linkBytes = 10e9 / 8;
  d.gemmFlops = 77.6e9;
  d.sumBytes = 22e9;
  SchemeSeconds f = schemeSeconds(full, 32, 8, 8, d);
  DeviceModel ds = d;
  ds.byteScale = static_cast<double>(full.m * full.n) / static_cast<double>(scaled.m * scaled.n);
  ds.flopScale = 32.0 / 3.0 * ds.byteScale;
  SchemeSeconds s = schemeSeconds(scaled, 3, 8, 8, ds);
  EXPECT_NEAR(s.ps / f.ps, 1.0, 0.01);
  EXPECT_NEAR(s.sfb / f.sfb, 1.0, 0.05);  // the factors' M + N scale a little differently from M N
  EXPECT_EQ(bestScheme(scaled, 3, 8, 8, SchemePolicy::kAuto, &ds), bestScheme(full, 32, 8, 8, SchemePolicy::kAuto, &d));
  EXPECT_EQ(bestScheme(scaled, 3, 8, 8, SchemePolicy::kAuto, &ds), Scheme::kPS);
}

TEST(DeviceModel, MachineRatesAreMeasured) {
  bench::MachineRates r = bench::measureMachineRates();
  // Positive and plausible, even under ThreadSanitizer, which instruments every add of the sums
  // (this 2-core CPU: ~78 GFLOP/s, 22 GB/s, 1.7 GB/s; under TSAN the sums measure ~75 MB/s).
  EXPECT_GT(r.gemmFlops, 1e6);
  EXPECT_GT(r.sumBytes, 1e6);
  EXPECT_GT(r.cryptoBytes, 1e6);
  EXPECT_LT(r.gemmFlops, 1e13);
}

}  // namespace
}  // namespace poseidon
