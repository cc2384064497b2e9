// The main job through the real CLI: real processes, real LibTorch, the real
// dataset (a subset of it, to keep the suite fast).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/cuda.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cli_helpers.h"
#include "poseidon/common/error.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

using testing::readFloats;
using testing::TempDir;

testing::Proc run(const std::vector<std::string>& args, const std::string& log, int timeoutSeconds = 300,
                  std::map<std::string, std::string> env = {}) {
  return testing::runCli(args, log, env, timeoutSeconds);
}

double maxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

// N = 4 workers with batch K and the data order of the distributed sampler
// give, after 5 SGD-with-momentum steps, the parameters of one process with
// batch 4K on the same samples.
class Exactness : public ::testing::TestWithParam<std::string> {};

TEST_P(Exactness, FourWorkersEqualOneProcessWithFourTimesTheBatch) {
  TempDir dir;
  std::string scheme = GetParam();
  for (const std::string model : {"lenet", "mlp"}) {
    auto one = run({"train", "--model", model, "--workers", "1", "--batch", "32", "--max-steps", "5", "--quiet",
                    "--save-params", dir.path + "/one.bin", "--lr", "0.05", "--threads", "1"},
                   dir.path + "/one");
    ASSERT_EQ(one.exitCode(), 0) << one.stderrText();
    auto four = run({"train", "--model", model, "--workers", "4", "--batch", "8", "--max-steps", "5", "--quiet",
                     "--scheme", scheme, "--save-params", dir.path + "/four.bin", "--lr", "0.05", "--summary",
                     dir.path + "/four.json"},
                    dir.path + "/four");
    ASSERT_EQ(four.exitCode(), 0) << four.stderrText();
    auto a = readFloats(dir.path + "/four.bin"), b = readFloats(dir.path + "/one.bin");
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GT(a.size(), 400000u);
    double diff = maxRelativeDifference(a, b);
    std::cout << model << " scheme " << scheme << ": max |4 workers - 1 process| / max |param| = " << diff << "\n";
    EXPECT_LT(diff, 1e-4) << model << " scheme " << scheme;
    std::ifstream sf(dir.path + "/four.json");
    auto summary = nlohmann::json::parse(sf);
    std::set<std::string> used;
    for (const auto& l : summary["layers"]) used.insert(l["scheme"].get<std::string>());
    if (scheme == "ps") {
      EXPECT_EQ(used, std::set<std::string>{"ps"}) << model;
    }
    if (scheme == "sfb" || (scheme == "auto" && model == "mlp")) {
      EXPECT_TRUE(used.count("sfb")) << model;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, Exactness, ::testing::Values("auto", "ps", "sfb"));

TEST(TrainCli, SummaryTraceAndOverlap) {
  TempDir dir;
  auto p = run({"train", "--workers", "4", "--batch", "32", "--epochs", "1", "--train-limit", "4096", "--summary",
                dir.path + "/s.json", "--trace", dir.path + "/t.json"},
               dir.path + "/run");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  std::string out = p.stdoutText();
  EXPECT_THAT(out, HasSubstr("layer    type  shape        scheme floats/iter/node"));
  EXPECT_THAT(out, HasSubstr("ip1      fc    500x800      sfb"));
  EXPECT_THAT(out, HasSubstr("epoch 1/1 [####################] 100%"));
  EXPECT_THAT(out, HasSubstr("test accuracy"));
  EXPECT_THAT(out, HasSubstr("vs Table 1 prediction"));
  std::ifstream sf(dir.path + "/s.json");
  auto s = nlohmann::json::parse(sf);
  for (const char* key : {"test_accuracy", "epochs", "workers", "batch", "images_per_sec", "bytes_sent_by_scheme",
                          "layers", "wall_seconds"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_EQ(s["workers"], 4);
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.5);
  EXPECT_GT(s["bytes_sent_by_scheme"]["sfb"].get<double>(), 0);
  EXPECT_GT(s["bytes_sent_by_scheme"]["ps"].get<double>(), 0);
  // Bytes measured by the counters against Table 1 (headers are the difference).
  double predicted = s["predicted_bytes_by_scheme"]["ps"].get<double>() + s["predicted_bytes_by_scheme"]["sfb"].get<double>();
  EXPECT_GT(predicted, 0);

  // The trace: per rank, sends of upper layers overlap the backward of lower layers.
  std::ifstream tf(dir.path + "/t.json");
  auto trace = nlohmann::json::parse(tf);
  struct Span {
    int64_t start, end;
  };
  std::map<std::pair<int, int64_t>, std::vector<Span>> sendsUpper, backwardLower;
  std::set<int> pids;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    std::string name = e["name"];
    int pid = e["pid"];
    pids.insert(pid);
    int64_t it = e.contains("args") ? e["args"]["iteration"].get<int64_t>() : -1;
    Span sp{e["ts"].get<int64_t>(), e["ts"].get<int64_t>() + e["dur"].get<int64_t>()};
    if (name.rfind("send ip", 0) == 0) sendsUpper[{pid, it}].push_back(sp);
    if (name == "backward conv1" || name == "backward conv2") backwardLower[{pid, it}].push_back(sp);
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
  int overlapping = 0, iterations = 0;
  for (const auto& [key, sends] : sendsUpper) {
    ++iterations;
    int64_t lowerEnd = 0;
    for (const auto& b : backwardLower[key]) lowerEnd = std::max(lowerEnd, b.end);
    for (const auto& snd : sends)
      if (snd.start < lowerEnd) {
        ++overlapping;
        break;
      }
  }
  EXPECT_GT(iterations, 100);
  // Wait-free backprop: in most iterations a send of ip1/ip2 starts before conv1/conv2's backward ends.
  EXPECT_GT(overlapping, iterations / 2) << overlapping << " of " << iterations;
}

// --wire bf16: the plan says so, the summary records it, and the bytes the counters saw match Table 1's
// floats at 2 bytes each (a wire left at fp32 would read 2x, a prediction left at 4 bytes 0.5x).
TEST(TrainCli, SixteenBitWireHalvesTheBytesTable1Predicts) {
  TempDir dir;
  auto p = run({"train", "--workers", "2", "--batch", "32", "--epochs", "1", "--train-limit", "2048", "--wire", "bf16",
                "--summary", dir.path + "/s.json"},
               dir.path + "/run");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  const std::string out = p.stdoutText();
  EXPECT_THAT(out, HasSubstr(", bf16 wire (lossy)"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(vs Table 1 prediction: .* \(([0-9.]+)x\))"))) << out;
  EXPECT_GE(std::stod(m[1]), 1.0) << out;
  EXPECT_LT(std::stod(m[1]), 1.05) << out;  // headers
  std::ifstream sf(dir.path + "/s.json");
  auto s = nlohmann::json::parse(sf);
  EXPECT_EQ(s["wire"], "bf16");
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.5);
}

// --overlap-forward (issue 14, docs/scheduling.md): step() returns at once and the next forward applies
// each layer's update just before the layer runs. The parameters equal the barrier path's bit for bit,
// through the points that read the model in between (curve copies, checkpoints, epoch ends apply the
// pending step first), and the summary counts the updates the forward applied.
TEST(TrainCli, OverlappedStepEqualsTheBarrierPathBitForBit) {
  TempDir dir;
  // 2 workers x batch 32 over 512 images: 8 steps an epoch, 16 in all. Curve copies after steps 5, 10
  // and 15 (scored on 256 training images), checkpoints after 6 and 12, evaluations after 8 and 16.
  auto job = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a{"train",
                               "--workers",
                               "2",
                               "--batch",
                               "32",
                               "--train-limit",
                               "512",
                               "--epochs",
                               "2",
                               "--curve-every",
                               "5",
                               "--curve-loss-samples",
                               "256",
                               "--checkpoint-every",
                               "6",
                               "--checkpoint",
                               dir.path + "/" + name + "-ck",
                               "--save-params",
                               dir.path + "/" + name + ".bin",
                               "--summary",
                               dir.path + "/" + name + ".json"};
    a.insert(a.end(), extra.begin(), extra.end());
    auto p = run(a, dir.path + "/" + name);
    EXPECT_EQ(p.exitCode(), 0) << p.stderrText();
    return p;
  };
  job("barrier", {});
  auto overlapped = job("overlap", {"--overlap-forward"});
  EXPECT_THAT(overlapped.stdoutText(), HasSubstr("wait-free backprop, overlapped step"));
  // The same over priority links (--send-window): 4 KB windows cut every message above that (SFB
  // factors, PS pairs) into fragments, and lower layers' pass upper ones queued before them.
  auto windowed = job("window", {"--overlap-forward", "--send-window", "4096"});
  // And with LeNet's first two layers (conv1, conv2) on the second, TOS-marked connection per peer.
  job("urgent", {"--overlap-forward", "--send-window", "4096", "--urgent-layers", "2"});
  // And the runtime's default window (-1: 1 MB with one peer, Van::defaultSendWindow).
  job("auto-window", {"--overlap-forward", "--send-window", "-1"});
  auto a = readFloats(dir.path + "/barrier.bin");
  ASSERT_EQ(a.size(), 431080u);
  for (const char* name : {"overlap", "window", "urgent", "auto-window"}) {
    auto b = readFloats(dir.path + "/" + name + ".bin");
    ASSERT_EQ(b.size(), a.size()) << name;
    EXPECT_EQ(testing::countDiffering(a, b), 0u) << name << ": of " << a.size() << " parameters";
  }
  std::ifstream fw(dir.path + "/window.json");
  auto sw = nlohmann::json::parse(fw);
  EXPECT_EQ(sw["send_window"], 4096);
  EXPECT_EQ(sw["updates_in_forward"], 9 * 4);
  EXPECT_EQ(sw["urgent_layers"], -1);  // automatic: none with 1 peer
  EXPECT_EQ(sw["urgent_bytes_sent"], 0);
  std::ifstream fu(dir.path + "/urgent.json");
  const auto su = nlohmann::json::parse(fu);
  EXPECT_EQ(su["urgent_layers"], 2);
  // conv1's and conv2's pushes and sums went on the urgent connections: a part of the PS bytes.
  EXPECT_GT(su["urgent_bytes_sent"].get<double>(), 0) << su.dump();
  EXPECT_LT(su["urgent_bytes_sent"].get<double>(), su["bytes_sent_by_scheme"]["ps"].get<double>()) << su.dump();
  std::ifstream fa(dir.path + "/barrier.json"), fb(dir.path + "/overlap.json");
  auto sa = nlohmann::json::parse(fa), sb = nlohmann::json::parse(fb);
  // The copies taken between steps are the updated models: their scores are the barrier path's.
  ASSERT_EQ(sb["curve"].size(), 3u) << sb["curve"].dump();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sa["curve"][i]["sample_loss"], sb["curve"][i]["sample_loss"]) << i;
    EXPECT_EQ(sa["curve"][i]["test_accuracy"], sb["curve"][i]["test_accuracy"]) << i;
  }
  EXPECT_EQ(sa["test_accuracy"], sb["test_accuracy"]);
  EXPECT_EQ(sb["overlap_forward"], true);
  // Steps 5, 6, 8, 10, 12, 15 and 16 were applied where the model was read; the other 9 steps' updates
  // were applied by the next forward, one per layer (LeNet: 4).
  EXPECT_EQ(sb["updates_in_forward"], 9 * 4);
  EXPECT_EQ(sa["updates_in_forward"], 0);
  EXPECT_EQ(sa["send_window"], 0);
  EXPECT_TRUE(fs::exists(dir.path + "/overlap-ck/step-000000012/model.pt"));

  auto refused =
      run({"train", "--workers", "2", "--groups", "2", "--merged-fc", "--overlap-forward", "--max-steps", "1"},
          dir.path + "/refused");
  EXPECT_EQ(refused.exitCode(), 2);
  EXPECT_THAT(refused.stderrText(), HasSubstr("--overlap-forward cannot be combined with --merged-fc"));
  // Checked once by poseidon train before it starts a worker (every rank checks it too): one line,
  // nothing started, so nothing to restart (the launcher's refusal to restart a usage error is
  // CliFlags.LaunchDoesNotRestartWhatWouldFailAgain).
  auto small = run({"train", "--workers", "2", "--send-window", "100", "--max-steps", "1", "--max-restarts", "2"},
                   dir.path + "/small");
  EXPECT_EQ(small.exitCode(), 2);
  EXPECT_EQ(small.stderrText(),
            "poseidon train: error: --send-window must be 0 (FIFO links), -1 (the runtime's default) or at least 4096 "
            "bytes (smaller ones cut messages into too many fragments), got 100\n");
  auto grouped =
      run({"train", "--workers", "2", "--groups", "2", "--send-window", "4096", "--max-steps", "1"}, dir.path + "/g");
  EXPECT_EQ(grouped.exitCode(), 2);
  EXPECT_THAT(grouped.stderrText(), HasSubstr("--send-window cannot be combined with --groups"));
  auto urgentAlone = run({"train", "--workers", "2", "--urgent-layers", "2", "--max-steps", "1"}, dir.path + "/u");
  EXPECT_EQ(urgentAlone.exitCode(), 2);
  EXPECT_THAT(urgentAlone.stderrText(), HasSubstr("--urgent-layers needs priority links (--send-window BYTES)"));
}

TEST(TrainCli, CheckpointResumeEqualsUninterruptedRun) {
  TempDir dir;
  std::vector<std::string> common{"train", "--workers", "2", "--batch", "32", "--train-limit", "1024", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto straight = run(with({"--epochs", "2", "--save-params", dir.path + "/straight.bin"}), dir.path + "/a");
  ASSERT_EQ(straight.exitCode(), 0) << straight.stderrText();
  auto first = run(with({"--epochs", "1", "--checkpoint", dir.path + "/ckpt"}), dir.path + "/b");
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  EXPECT_TRUE(fs::exists(dir.path + "/ckpt/step-000000016/model.pt"));
  auto resumed = run(with({"--epochs", "2", "--checkpoint", dir.path + "/ckpt", "--save-params", dir.path + "/resumed.bin"}),
                     dir.path + "/c");
  ASSERT_EQ(resumed.exitCode(), 0) << resumed.stderrText();
  EXPECT_THAT(resumed.stdoutText(),
              HasSubstr("resuming from " + dir.path + "/ckpt/step-000000016 (iteration 16: epoch 2, step 0)"));
  EXPECT_EQ(readFloats(dir.path + "/resumed.bin"), readFloats(dir.path + "/straight.bin"));
}

TEST(TrainCli, BadInputGetsOneLineErrors) {
  TempDir dir;
  auto missing = run({"train", "--data", "/nonexistent"}, dir.path + "/m", 60);
  EXPECT_EQ(missing.exitCode(), 2);
  EXPECT_THAT(missing.stderrText(), HasSubstr("apt-get install dataset-fashion-mnist"));
  auto flag = run({"train", "--epoch", "3"}, dir.path + "/f", 60);
  EXPECT_EQ(flag.exitCode(), 2);
  EXPECT_THAT(flag.stderrText(), HasSubstr("unknown flag --epoch for 'poseidon train'"));
  auto value = run({"train", "--batch", "many"}, dir.path + "/v", 60);
  EXPECT_EQ(value.exitCode(), 2);
  EXPECT_THAT(value.stderrText(), HasSubstr("--batch expects an integer, got 'many'"));
  auto device = run({"train", "--device", "tpu"}, dir.path + "/d", 60);
  EXPECT_EQ(device.exitCode(), 2);
  EXPECT_THAT(device.stderrText(), HasSubstr("--device must be cpu, cuda or auto, got 'tpu'"));
  if (torch::cuda::device_count() == 0) {  // CI: one line before any worker starts
    auto cuda = run({"train", "--device", "cuda"}, dir.path + "/g", 60);
    EXPECT_EQ(cuda.exitCode(), 2);
    EXPECT_EQ(cuda.stderrText(),
              "poseidon train: error: --device cuda: LibTorch sees no CUDA device here (a CPU-only build, "
              "or no GPU visible); use --device cpu\n");
  }
  auto model = run({"train", "--model", "resnet"}, dir.path + "/r", 60);
  EXPECT_NE(model.exitCode(), 0);
  EXPECT_THAT(model.stderrText(), HasSubstr("unknown model 'resnet' (expected lenet, cifar10-quick or mlp)"));
  fs::create_directories(dir.path + "/badckpt/step-000000003");
  std::ofstream(dir.path + "/badckpt/step-000000003/meta.json") << "{not json";
  auto ckpt = run({"train", "--workers", "1", "--checkpoint", dir.path + "/badckpt", "--train-limit", "64"}, dir.path + "/c", 60);
  EXPECT_NE(ckpt.exitCode(), 0);
  EXPECT_THAT(ckpt.stderrText(), HasSubstr("checkpoint " + dir.path + "/badckpt/step-000000003 is unreadable"));
  // Only the test split there: the training split is missed once, before any worker starts (the
  // launcher checked the test split alone, and each worker then failed on its own).
  fs::create_directories(dir.path + "/testonly");
  for (const char* f : {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::copy_file(std::string(data::kDefaultFashionMnistDir) + "/" + f, dir.path + "/testonly/" + f);
  }
  auto split = run({"train", "--workers", "2", "--data", dir.path + "/testonly"}, dir.path + "/s", 60);
  EXPECT_EQ(split.exitCode(), 2);
  EXPECT_EQ(split.stderrText(), "poseidon train: error: Fashion-MNIST not found at " + dir.path +
                                    "/testonly/train-images-idx3-ubyte.gz: install it with 'apt-get install "
                                    "dataset-fashion-mnist' or pass --data DIR\n");
}

// Slurm sets SLURM_PROCID and SLURM_NTASKS in a batch script too, where the process is not one of the
// job's tasks (no SLURM_STEP_ID). `poseidon train --workers 2` there was refused as disagreeing with
// the world of 4, and a plain `poseidon train` waited out its timeout as rank 0 of 4. It now runs, and
// one line says why it did not take the allocation's tasks.
TEST(TrainCli, ASlurmBatchScriptRunsItsOwnWorld) {
  TempDir dir;
  auto p = run({"train", "--workers", "2", "--model", "mlp", "--batch", "16", "--train-limit", "256", "--max-steps",
                "2", "--quiet", "--summary", dir.path + "/s.json"},
               dir.path + "/slurm", 240, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}});
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  const std::string note =
      "poseidon: note: SLURM_PROCID=0 and SLURM_NTASKS=4 are set but SLURM_STEP_ID is not: this is Slurm's batch "
      "script or an salloc shell, not one of the job's tasks, so it does not wait as rank 0 of 4 (start the ranks "
      "with srun to run them as the job's tasks)\n";
  EXPECT_EQ(p.stderrText(), note);  // once: the workers it starts are poseidon launch's ranks
  EXPECT_EQ(testing::readJson(dir.path + "/s.json")["workers"].get<int>(), 2);
}

// Out-of-range values are refused while the flags are parsed, under their own
// names: before, --pair-bytes 0 surfaced from rendezvous as "malformed join
// message: job settings out of range" and --sync-threads 0 as "--threads".
TEST(TrainCli, OutOfRangeValuesAreRejectedBeforeRendezvous) {
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases{
      {{"--pair-bytes", "0"}, "--pair-bytes must be in [4, 1073741824], got 0"},
      {{"--sync-threads", "0"}, "--sync-threads must be in [1, 1024], got 0"},
      {{"--sync-threads", "100000"}, "--sync-threads must be in [1, 1024], got 100000"},
      {{"--threads", "100000"}, "--threads must be in [0, 1024], got 100000"},
      {{"--workers", "0"}, "--workers must be in [1, 65536], got 0"},
      {{"--batch", "0"}, "--batch must be in [1, 16777216], got 0"},
      {{"--momentum", "1"}, "--momentum must be in [0, 1), got 1"},
      {{"--max-steps", "0"}, "--max-steps must be -1 or >= 1, got 0"},
      {{"--timeout", "0"}, "--timeout must be >= 1, got 0"},
      {{"--drop-stragglers", "70000"}, "--drop-stragglers must be in [0, 65535], got 70000"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"train", "--workers", "2", "--max-steps", "2", "--train-limit", "128"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto p = run(args, dir.path + "/" + c.args[0].substr(2), 60);
    EXPECT_EQ(p.exitCode(), 2) << c.args[0] << ": " << p.stderrText();
    EXPECT_EQ(p.stderrText(), "poseidon train: error: " + c.message + "\n");
    EXPECT_EQ(p.stdoutText(), "") << c.args[0];  // no worker was started
  }
}

// Output paths that cannot be written are reported before the first step,
// naming the flag and the path, instead of after the whole run: a job that
// would train for minutes (5 epochs of all 60000 images) is out within seconds
// and printed neither the plan nor a progress line.
TEST(TrainCli, UnwritableOutputPathsFailBeforeTraining) {
  TempDir dir;
  std::ofstream(dir.path + "/file") << "not a directory";
  struct Case {
    std::string flag, path, says;
  };
  const Case cases[] = {
      {"--summary", "/nonexistent-dir/x.json", "cannot create files in /nonexistent-dir: No such file or directory"},
      {"--summary", dir.path, "is a directory, expected a file name"},
      {"--save-params", dir.path + "/missing/p.bin",
       "cannot create files in " + dir.path + "/missing: No such file or directory"},
      {"--checkpoint", dir.path + "/file/ck", "cannot create it: Not a directory"},
      {"--trace", dir.path + "/file/t.json", "cannot create files in " + dir.path + "/file: Not a directory"},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flag + " " + c.path);
    auto p = run({"train", "--workers", "2", "--model", "mlp", c.flag, c.path}, dir.path + "/p" + std::to_string(n++),
                 120);
    EXPECT_EQ(p.exitCode(), 2) << p.stderrText();
    // One line, from the command that started the workers, not a rank's and the launcher's echo of it.
    EXPECT_EQ(p.stderrText(), "poseidon train: error: " + c.flag + " " + c.path + ": " + c.says + "\n");
    EXPECT_THAT(p.stdoutText(), Not(HasSubstr("poseidon train: mlp")));
    EXPECT_THAT(p.stdoutText(), Not(HasSubstr("epoch 1/5")));
    EXPECT_LT(p.seconds, 60);
  }
}

// --timeout is in milliseconds: "--timeout 5" meant as seconds would fail the rendezvous with what
// looks like a network problem. One warning, up front, from the command (not again from its rank 0).
TEST(TrainCli, ASubSecondTimeoutIsSaidToBeMilliseconds) {
  TempDir dir;
  auto p = run({"train", "--workers", "2", "--timeout", "5", "--max-steps", "2", "--train-limit", "64", "--quiet"},
               dir.path + "/t", 120);
  const std::string err = p.stderrText(),
                    warning = "warning: --timeout 5 is in milliseconds: every distributed wait gives up after 0.005 s";
  EXPECT_EQ(err.rfind("poseidon train: " + warning + "\n", 0), 0u) << err;
  EXPECT_EQ(err.find(warning), err.rfind(warning)) << "said more than once: " << err;
}

// Two ranks that share nothing but the coordinator's address: each binds its
// own loopback address, proving nothing assumes one host address. Each is its host's only rank
// (LOCAL_WORLD_SIZE=1), so it trains on all of the host's cores: it took cores / the job's size.
TEST(TrainCli, TwoRanksOnTwoLoopbackAddresses) {
  TempDir dir;
  int port = freePort("127.0.0.2");
  std::vector<testing::Proc> procs;
  for (int r = 0; r < 2; ++r) {
    std::map<std::string, std::string> env{{"RANK", std::to_string(r)},  {"WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "127.0.0.2"}, {"MASTER_PORT", std::to_string(port)},
                                           {"POSEIDON_LOG", "info"},     {"LOCAL_WORLD_SIZE", "1"}};
    procs.push_back(testing::spawn(
        {POSEIDON_CLI, "train", "--bind", r == 0 ? "127.0.0.2" : "127.0.0.3", "--max-steps", "3", "--train-limit",
         "256", "--quiet", "--batch", "16", "--summary", dir.path + "/s" + std::to_string(r) + ".json"},
        env, dir.path + "/r" + std::to_string(r)));
  }
  testing::waitAll(procs, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) ASSERT_EQ(procs[r].exitCode(), 0) << procs[r].stderrText();
  EXPECT_THAT(procs[0].stderrText(), HasSubstr("data endpoint tcp://127.0.0.2:"));
  EXPECT_THAT(procs[1].stderrText(), HasSubstr("data endpoint tcp://127.0.0.3:"));
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(testing::readJson(dir.path + "/s0.json")["torch_threads"], cores);
}

// Lines of a failing rank name it once: the launcher's "[rank 1] " replaces
// the rank's own marker (its error line, messages that start "rank 1: ")
// instead of preceding it, and the failure report names the rank itself.
std::vector<std::string> linesWith(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

TEST(TrainCli, FailingRankErrorLineCarriesTheRankOnce) {
  TempDir dir;
  std::vector<std::string> args{"train", "--workers", "2", "--max-steps", "4", "--train-limit", "128", "--quiet",
                                "--timeout", "3000"};
  // Rank 0 stops at iteration 1; rank 1 declares it lost and fails.
  auto lost = run(args, dir.path + "/lost", 120, {{"POSEIDON_FAULT", "0:1:stop"}});
  EXPECT_EQ(lost.exitCode(), 1);
  std::string err = lost.stderrText();
  auto errorLines = linesWith(err, "poseidon train: error: ");
  ASSERT_FALSE(errorLines.empty()) << err;
  EXPECT_THAT(errorLines[0], ::testing::StartsWith("[rank 1] poseidon train: error: lost rank 0 (nothing from it for"));
  EXPECT_THAT(err, HasSubstr("poseidon train: rank 1 exited with code 1: poseidon train: error: lost rank 0 ("));
  EXPECT_THAT(err, ::testing::Not(HasSubstr("[rank 1] [rank 1]")));
  EXPECT_THAT(err, ::testing::Not(HasSubstr("[rank 1] rank 1:")));
  // Said once by the rank: its node no longer logs the same error ("[rank 1] error: lost rank 0 ...")
  // ahead of the rank's error line, and once by the launcher.
  EXPECT_EQ(linesWith(err, "lost rank 0 (nothing from it for").size(), 2u) << err;
  EXPECT_THAT(err, ::testing::Not(HasSubstr("error: rank 1: lost")));

  // Rank 1 kills itself; the trainer's "rank 1: fault injection" line gets the launcher's prefix only.
  auto killed = run(args, dir.path + "/killed", 120, {{"POSEIDON_FAULT", "1:1:kill"}});
  EXPECT_NE(killed.exitCode(), 0);
  EXPECT_THAT(killed.stderrText(), HasSubstr("[rank 1] fault injection (POSEIDON_FAULT): signal 9 at iteration 1\n"));
  EXPECT_THAT(killed.stderrText(), HasSubstr("poseidon train: rank 1 was killed by signal 9 (Killed): fault injection"));
  EXPECT_THAT(killed.stderrText(), ::testing::Not(HasSubstr("[rank 1] rank 1:")));
}

// A huge learning rate: the training diverges within a few steps. It is an error by default: every
// rank stops at that step (BSP: they hold the same mean gradient), rank 0 prints one line naming the
// step, who found it, the learning rate and what to try, every rank exits with code 3 (none is killed,
// none fails waiting for another), the job is not restarted, and the summary says where. The same with an
// odd worker count, the overlapped step, straggler dropping, and compute groups under a staleness
// bound (each group finds it in the shards' model; the ranks decide together at the epoch's end).
TEST(TrainCli, DivergenceIsAnErrorThatStopsEveryRankAtThatStep) {
  TempDir dir;
  const std::vector<std::string> job{"train", "--lr", "5", "--warmup-steps", "0", "--train-limit", "2048", "--epochs",
                                     "3", "--quiet", "--threads", "1", "--timeout", "60000", "--max-restarts", "2"};
  struct Case {
    std::string name;
    std::vector<std::string> flags;
    std::string who;
  };
  const std::vector<Case> cases{
      {"bsp", {"--workers", "3"}, "found by every rank: the mean gradient of layer 'conv1' is not finite"},
      {"overlap", {"--workers", "2", "--overlap-forward"}, "found by every rank: the mean gradient of layer '"},
      {"stragglers", {"--workers", "3", "--drop-stragglers", "1", "--straggler-timeout", "30000"},
       "found by every rank: the mean gradient of layer '"},
      {"groups", {"--workers", "4", "--batch", "16", "--groups", "2", "--staleness", "1"}, "found by rank "},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> args = job;
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    args.insert(args.end(), {"--summary", dir.path + "/" + c.name + ".json"});
    auto p = run(args, dir.path + "/" + c.name, 300);
    EXPECT_EQ(p.exitCode(), 3) << p.stdoutText() << p.stderrText();
    auto s = nlohmann::json::parse(std::ifstream(dir.path + "/" + c.name + ".json"));
    EXPECT_EQ(s["diverged"], true) << s.dump();
    ASSERT_TRUE(s["diverged_at_step"].is_number()) << s.dump();
    const int d = s["diverged_at_step"];
    EXPECT_GE(d, 1);
    EXPECT_LT(d, 20);  // lr 5 from the first step: long before the 3 epochs' 96 steps (2048 / 64)
    const std::string lines = p.stderrText();
    auto errors = linesWith(lines, "error");
    ASSERT_EQ(errors.size(), 1u) << lines;
    EXPECT_THAT(errors[0], ::testing::StartsWith(strCat("poseidon train: error: the training diverged at step ", d,
                                                        " (epoch 1; ", c.who)));
    EXPECT_THAT(errors[0], HasSubstr(") at learning rate 5 (no warm-up); try a lower --lr (e.g. 1.25) or a longer "
                                     "--warmup-steps, or --allow-divergence to record the run as a result"));
    EXPECT_THAT(lines, Not(HasSubstr("exited with code")));  // no rank failed otherwise or was stopped
    EXPECT_THAT(lines, Not(HasSubstr("restart")));           // a restart would diverge again
    // A rank that waited out its timeout would have failed with an error line of its own (counted above).
  }
}

TEST(LaunchCli, FailingRankStopsTheOthers) {
  TempDir dir;
  // Rank 1 fails only once rank 0 has said hello (an event, not a head start in time), so the
  // hello is always there to be forwarded; the others' 'sleep 60' must be cut short. The event is a
  // FIFO: rank 1's open for reading returns once rank 0 opens it for writing, after its hello.
  const std::string said = dir.path + "/rank0-said-hello";
  ASSERT_EQ(::mkfifo(said.c_str(), 0600), 0) << std::strerror(errno);
  auto p = run({"launch", "-n", "3", "--", "/bin/sh", "-c",
                "if [ \"$RANK\" = 1 ]; then read x < " + said +
                    "; echo boom >&2; exit 3; fi; "
                    "echo hello from $RANK of $WORLD_SIZE; [ \"$RANK\" = 0 ] && : > " +
                    said + "; sleep 60"},
               dir.path + "/l", 120);
  EXPECT_EQ(p.exitCode(), 3);
  EXPECT_LT(p.seconds, 60);
  EXPECT_THAT(p.stderrText(), HasSubstr("[rank 1] boom"));
  EXPECT_THAT(p.stderrText(), HasSubstr("poseidon launch: rank 1 exited with code 3: boom; stopped the other ranks"));
  EXPECT_THAT(p.stdoutText(), HasSubstr("[rank 0] hello from 0 of 3"));
}

// What a rank started is stopped with it: rank 0, a shell, runs sleep as its child (not exec'd),
// and rank 1's failure must take that grandchild too, not leave it to init.
TEST(LaunchCli, StoppingARankStopsWhatItStarted) {
  TempDir dir;
  const std::string said = dir.path + "/rank0-started-sleep", pidFile = dir.path + "/sleep.pid";
  ASSERT_EQ(::mkfifo(said.c_str(), 0600), 0) << std::strerror(errno);
  auto p = run({"launch", "-n", "2", "--", "/bin/sh", "-c",
                "if [ \"$RANK\" = 1 ]; then read x < " + said + "; exit 3; fi; sleep 60 & echo $! > " + pidFile +
                    "; : > " + said + "; wait"},
               dir.path + "/l", 120);
  EXPECT_EQ(p.exitCode(), 3) << p.stderrText();
  std::ifstream in(pidFile);
  long pid = 0;
  ASSERT_TRUE(in >> pid) << "rank 0 wrote no pid";
  // The launcher waits for its ranks, not for what they started: the grandchild's SIGTERM may still be
  // on its way out when the launcher exits. Its exit is the event (a pidfd turns readable, zombie or
  // reaped), within the launcher's own grace before SIGKILL, twice over (LaunchOptions::killGrace).
  const int fd = testing::openPidfd(static_cast<pid_t>(pid));
  if (fd < 0) return;  // already gone and reaped
  std::vector<pollfd> fds{{fd, POLLIN, 0}};
  const int exited = testing::pollReadable(fds, std::chrono::steady_clock::now() + 2 * LaunchOptions{}.killGrace);
  ::close(fd);
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string statLine;
  std::getline(stat, statLine);
  EXPECT_EQ(exited, 1) << "the grandchild still runs: " << statLine;
}

// More ranks than this process may hold pipes for: one line before any rank starts (it said "pipe():
// Too many open files" after starting some, which were left waiting at rendezvous). Under a soft
// limit alone the launcher raises it to the hard one and starts every rank.
TEST(LaunchCli, TooFewFileDescriptorsIsSaidBeforeAnyRankStarts) {
  TempDir dir;
  const std::string cli = POSEIDON_CLI;
  std::vector<testing::Proc> hard{testing::spawn(
      {"/bin/sh", "-c", "ulimit -n 64 && exec " + cli + " launch -n 40 -- /bin/sh -c 'echo started'"}, {},
      dir.path + "/hard")};
  testing::waitAll(hard, std::chrono::seconds(120));
  EXPECT_EQ(hard[0].exitCode(), 2) << hard[0].stderrText();
  EXPECT_EQ(hard[0].stderrText(),
            "poseidon launch: error: -n 40 needs about 112 open files (two output pipes per rank) and this process "
            "may open 64 (hard limit 64): raise it (ulimit -n) or start fewer ranks\n");
  EXPECT_THAT(hard[0].stdoutText(), Not(HasSubstr("started")));
  std::vector<testing::Proc> soft{testing::spawn(
      {"/bin/sh", "-c", "ulimit -Sn 64 && exec " + cli + " launch -n 40 -- /bin/sh -c 'echo started'"}, {},
      dir.path + "/soft")};
  testing::waitAll(soft, std::chrono::seconds(120));
  EXPECT_EQ(soft[0].exitCode(), 0) << soft[0].stderrText();
  EXPECT_THAT(soft[0].stdoutText(), HasSubstr("[rank 39] started"));
}

// A rank that died of a Python exception: the closing line names the traceback's exception, not
// the lines printed after it (the runtime's exit messages).
TEST(LaunchCli, TheClosingLineNamesAPythonException) {
  TempDir dir;
  auto p = run({"launch", "-n", "2", "--", "/bin/sh", "-c",
                "if [ \"$RANK\" = 1 ]; then printf 'Traceback (most recent call last):\\n  File \"x.py\", line 1, in "
                "<module>\\nValueError: bad label 7\\n[poseidon] error: after the traceback\\n' >&2; exit 1; fi; exec "
                "sleep 60"},
               dir.path + "/l", 120);
  EXPECT_EQ(p.exitCode(), 1) << p.stderrText();
  EXPECT_THAT(p.stderrText(),
              HasSubstr("poseidon launch: rank 1 exited with code 1: ValueError: bad label 7; stopped the other ranks\n"));
}

// Ctrl-C at the launcher: every rank is stopped, one line says so (not "...; stopped the other ranks"
// after it), and the exit status is the shell's for SIGINT. The ranks were told who started them.
TEST(LaunchCli, InterruptStopsEveryRankWithOneLine) {
  TempDir dir;
  std::vector<testing::Proc> procs{testing::spawn(
      {POSEIDON_CLI, "launch", "-n", "2", "--", "/bin/sh", "-c",
       "echo \"$POSEIDON_LAUNCHER\" > " + dir.path + "/rank$RANK.tmp && mv " + dir.path + "/rank$RANK.tmp " + dir.path +
           "/rank$RANK; exec sleep 60"},
      {}, dir.path + "/l")};
  const bool up = testing::waitForPolled(
      [&] { return fs::exists(dir.path + "/rank0") && fs::exists(dir.path + "/rank1"); }, std::chrono::seconds(60));
  ASSERT_TRUE(up) << procs[0].stderrText();
  ::kill(procs[0].pid, SIGINT);
  testing::waitAll(procs, std::chrono::seconds(60));
  EXPECT_FALSE(procs[0].killed);
  EXPECT_EQ(procs[0].exitCode(), 130);
  EXPECT_EQ(procs[0].stderrText(), "poseidon launch: interrupted by SIGINT; stopped all ranks\n");
  std::ifstream said(dir.path + "/rank1");
  std::string launcher;
  std::getline(said, launcher);
  EXPECT_EQ(launcher, "poseidon launch");
}

// Whether pid is a live process (not gone, not a zombie waiting for init to reap it).
bool running(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && line.substr(close + 2, 1) != "Z";
}

long pidIn(const std::string& file) {
  std::ifstream in(file);
  long pid = 0;
  return in >> pid ? pid : 0;
}

// Nothing of a job outlives its launcher: the terminal closing (SIGHUP: the ranks, each in a process
// group of its own, never got it, and the launcher died without a word), the launcher killed outright
// (its ranks trained on alone), and what a rank started and left running when the job ended.
TEST(LaunchCli, NothingOfAJobOutlivesItsLauncher) {
  TempDir dir;
  const std::string ranks = "echo $$ > " + dir.path + "/pid$RANK.tmp && mv " + dir.path + "/pid$RANK.tmp " + dir.path;
  const auto up = [&](const std::string& tag) {
    return testing::waitForPolled([&] { return pidIn(dir.path + "/" + tag + "0") && pidIn(dir.path + "/" + tag + "1"); },
                                  std::chrono::seconds(60));
  };
  const auto gone = [&](const std::string& tag) {
    return testing::waitForPolled(
        [&] { return !running(pidIn(dir.path + "/" + tag + "0")) && !running(pidIn(dir.path + "/" + tag + "1")); },
        std::chrono::seconds(60));
  };
  std::vector<testing::Proc> hup{testing::spawn(
      {POSEIDON_CLI, "launch", "-n", "2", "--", "/bin/sh", "-c", ranks + "/hup$RANK; exec sleep 600"}, {}, dir.path + "/hup")};
  ASSERT_TRUE(up("hup")) << hup[0].stderrText();
  ::kill(hup[0].pid, SIGHUP);
  testing::waitAll(hup, std::chrono::seconds(60));
  EXPECT_EQ(hup[0].exitCode(), 129);
  EXPECT_EQ(hup[0].stderrText(), "poseidon launch: interrupted by SIGHUP; stopped all ranks\n");
  EXPECT_TRUE(gone("hup"));

  std::vector<testing::Proc> killed{testing::spawn(
      {POSEIDON_CLI, "launch", "-n", "2", "--", "/bin/sh", "-c", ranks + "/kill$RANK; exec sleep 600"}, {},
      dir.path + "/kill")};
  ASSERT_TRUE(up("kill")) << killed[0].stderrText();
  ::kill(killed[0].pid, SIGKILL);
  testing::waitAll(killed, std::chrono::seconds(60));
  EXPECT_TRUE(gone("kill")) << "the ranks trained on after their launcher was killed";

  auto left = run({"launch", "-n=2", "--", "/bin/sh", "-c",  // -n=N as well as -n N
                   "sleep 600 & echo $! > " + dir.path + "/bg$RANK.tmp && mv " + dir.path + "/bg$RANK.tmp " + dir.path +
                       "/bg$RANK; echo started"},
                  dir.path + "/bg", 120);
  EXPECT_EQ(left.exitCode(), 0) << left.stderrText();
  EXPECT_LT(left.seconds, 60);  // it waited 5 s for the pipes the leftovers held
  ASSERT_TRUE(pidIn(dir.path + "/bg0") && pidIn(dir.path + "/bg1"));
  EXPECT_TRUE(gone("bg")) << "what a rank started outlived the job";
  // The sleeps outlive the 60 s polls by far when nothing stops them; none is left behind either way.
  for (const std::string tag : {"hup", "kill", "bg"})
    for (int r = 0; r < 2; ++r)
      if (const long pid = pidIn(dir.path + "/" + tag + std::to_string(r)); running(pid)) ::kill(pid, SIGKILL);
}

// A --master-port that is taken: the rank's error names the launcher's flag (it said "choose another
// MASTER_PORT", a variable the user never set).
TEST(LaunchCli, ATakenMasterPortNamesTheFlag) {
  TempDir dir;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int port = freePort("127.0.0.1");
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(fd, 1), 0);
  auto p = run({"launch", "-n", "2", "--master-port", std::to_string(port), "--", POSEIDON_CLI, "train", "--max-steps",
                "1", "--train-limit", "64", "--quiet"},
               dir.path + "/l", 120);
  ::close(fd);
  EXPECT_NE(p.exitCode(), 0);
  EXPECT_THAT(p.stderrText(), HasSubstr("cannot start the coordinator on 127.0.0.1:" + std::to_string(port) +
                                        ": Address already in use (the port is in use: another job or a leftover "
                                        "process holds it; choose another --master-port, or leave it out for a free "
                                        "one)"));
}

// A stopped rank is stopped with the others at once: SIGTERM acts on a stopped process only once it
// runs again, so the launcher sends SIGCONT after it (without, the rank waited out the grace and died of
// the SIGKILL, its TERM trap never run). Rank 1 fails once rank 0 is stopped (an event: its state T).
TEST(LaunchCli, AStoppedRankIsStoppedWithTheOthers) {
  TempDir dir;
  const std::string pidFile = dir.path + "/rank0.pid";
  auto p = run({"launch", "-n", "2", "--", "/bin/sh", "-c",
                "if [ \"$RANK\" = 0 ]; then trap 'echo rank 0 got SIGTERM; exit 0' TERM; echo $$ > " + pidFile +
                    ".tmp && mv " + pidFile + ".tmp " + pidFile + "; kill -STOP $$; exit 0; fi; "
                    "while [ ! -s " + pidFile + " ]; do sleep 0.05; done; "
                    "while ! grep -q '^State:.*T' /proc/$(cat " + pidFile + ")/status; do sleep 0.05; done; exit 3"},
               dir.path + "/l", 120);
  EXPECT_EQ(p.exitCode(), 3) << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("[rank 0] rank 0 got SIGTERM"));
}

// --transport-security none (launch sets POSEIDON_TRANSPORT_SECURITY for its ranks; train's flag
// says the same): rank 0 says so once, loudly, and the training is the encrypted run's, bit for bit.
TEST(LaunchCli, TransportSecurityNoneTrainsTheSameModelUnencrypted) {
  TempDir dir;
  std::map<std::string, std::vector<float>> params;
  for (const std::string mode : {"curve", "none"}) {
    auto p = run({"launch",
                  "-n",
                  "2",
                  "--transport-security",
                  mode,
                  "--",
                  POSEIDON_CLI,
                  "train",
                  "--max-steps",
                  "3",
                  "--train-limit",
                  "256",
                  "--quiet",
                  "--batch",
                  "16",
                  "--scheme",
                  "auto",
                  "--model",
                  "mlp",
                  "--save-params",
                  dir.path + "/" + mode + ".bin"},
                 dir.path + "/" + mode, 120);
    ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
    const std::string all = p.stdoutText() + p.stderrText();
    EXPECT_EQ(all.find("TRANSPORT SECURITY OFF") != std::string::npos, mode == "none") << all;
    EXPECT_EQ(all.find("TRANSPORT SECURITY OFF"), all.rfind("TRANSPORT SECURITY OFF")) << "said once: " << all;
    params[mode] = readFloats(dir.path + "/" + mode + ".bin");
  }
  ASSERT_GT(params["none"].size(), 100000u);
  EXPECT_EQ(params["none"], params["curve"]);
  auto bad = run({"launch", "-n", "1", "--transport-security", "tls", "--", "true"}, dir.path + "/bad", 60);
  EXPECT_EQ(bad.exitCode(), 2);
  EXPECT_THAT(bad.stderrText(), HasSubstr("--transport-security must be curve or none, got 'tls'"));
  auto train = run({"train", "--transport-security", "tls"}, dir.path + "/bad-train", 60);
  EXPECT_EQ(train.exitCode(), 2);
  EXPECT_THAT(train.stderrText(), HasSubstr("--transport-security must be curve or none, got 'tls'"));
}

TEST(LaunchCli, LaunchesTrainRanks) {
  TempDir dir;
  auto p = run({"launch", "-n", "2", "--", POSEIDON_CLI, "train", "--max-steps", "2", "--train-limit", "128", "--quiet",
                "--batch", "16"},
               dir.path + "/l", 120);
  EXPECT_EQ(p.exitCode(), 0) << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("[rank 0] poseidon train: lenet (431080 params) on Fashion-MNIST, 2 workers"));
}

}  // namespace
}  // namespace poseidon
