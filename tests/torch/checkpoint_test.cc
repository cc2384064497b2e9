// Checkpoints in one process: checksums, fallback from damaged checkpoints,
// and a full disk (a small tmpfs) while saving.
#include "poseidon/torch/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint_helpers.h"
#include "cli_helpers.h"
#include "poseidon/common/error.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/launch/env.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

using testing::TempDir;
using testing::TrainState;

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string messageOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(Checkpoint, ResumesTheNewestAndRecordsChecksums) {
  TempDir dir;
  TrainState job;
  job.save(dir.path + "/ck", 5);
  job.step();
  std::string ten = job.save(dir.path + "/ck", 10);
  auto expected = job.params();

  std::ifstream mf(ten + "/meta.json");
  auto meta = nlohmann::json::parse(mf);
  EXPECT_EQ(meta["files"]["model.pt"]["bytes"].get<uint64_t>(), fs::file_size(ten + "/model.pt"));
  EXPECT_EQ(meta["files"]["optimizer.pt"]["crc32"].get<std::string>().size(), 8u);
  EXPECT_TRUE(meta.contains("meta_crc32"));

  TrainState other;  // other initial weights
  ASSERT_FALSE(testing::sameTensors(other.params(), expected));
  auto r = pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer);
  EXPECT_EQ(r.path, ten);
  EXPECT_EQ(r.meta.iteration, 10);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
  EXPECT_TRUE(testing::sameTensors(other.params(), expected));
}

// How a test damages a checkpoint file, and which file.
struct Damage {
  std::string name, file;
  std::function<void(const std::string& path)> apply;
};

std::ostream& operator<<(std::ostream& os, const Damage& d) { return os << d.name; }

const Damage kDamages[] = {
    // 4 KiB of zeros in the middle of model.pt: LeNet's ip1 weights, the silent kind of damage.
    {"ModelZeros", "model.pt", [](const std::string& p) { testing::zeroBytes(p, fs::file_size(p) / 2, 4096); }},
    {"OptimizerBitFlip", "optimizer.pt", [](const std::string& p) { testing::flipByte(p, fs::file_size(p) / 2); }},
    {"MetaIterationChanged", "meta.json", [](const std::string& p) { testing::alterIteration(p); }},
    {"MetaZeros", "meta.json", [](const std::string& p) { testing::zeroBytes(p, 0, 64); }},
};

class DamagedCheckpoint : public ::testing::TestWithParam<Damage> {};

TEST_P(DamagedCheckpoint, IsRefusedByNameAndResumeFallsBackToTheOlderOne) {
  const Damage& d = GetParam();
  TempDir dir;
  TrainState job;
  std::string five = job.save(dir.path + "/ck", 5);
  auto atFive = job.params();
  job.step();
  std::string ten = job.save(dir.path + "/ck", 10);
  d.apply(ten + "/" + d.file);

  TrainState other;
  auto before = other.params();
  std::string refused = messageOf([&] { pt::loadCheckpoint(ten, job.meta, *other.net.module, other.optimizer); });
  EXPECT_THAT(refused, HasSubstr("checkpoint " + ten + " is "));
  EXPECT_THAT(refused, HasSubstr(d.file));
  EXPECT_THROW(pt::loadCheckpoint(ten, job.meta, *other.net.module, other.optimizer), pt::CheckpointDamaged);
  EXPECT_TRUE(testing::sameTensors(other.params(), before)) << "a refused checkpoint changed the module";

  auto r = pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer);
  EXPECT_EQ(r.path, five);
  EXPECT_EQ(r.meta.iteration, 5);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0], HasSubstr("checkpoint " + ten + " is "));
  EXPECT_THAT(r.warnings[0], HasSubstr(d.file));
  EXPECT_THAT(r.warnings[0], HasSubstr("resuming from the older " + five));
  EXPECT_TRUE(testing::sameTensors(other.params(), atFive));
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, DamagedCheckpoint, ::testing::ValuesIn(kDamages),
                         [](const auto& info) { return info.param.name; });

TEST(Checkpoint, EveryCheckpointDamagedIsRefusedNotRestarted) {
  TempDir dir;
  TrainState job;
  std::string five = job.save(dir.path + "/ck", 5), ten = job.save(dir.path + "/ck", 10);
  testing::flipByte(five + "/model.pt", fs::file_size(five + "/model.pt") / 2);
  testing::flipByte(ten + "/optimizer.pt", fs::file_size(ten + "/optimizer.pt") / 2);
  TrainState other;
  std::string m =
      messageOf([&] { pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer); });
  EXPECT_THAT(m, HasSubstr("no intact checkpoint in " + dir.path + "/ck"));
  EXPECT_THAT(m, HasSubstr("checkpoint " + ten + " is damaged: optimizer.pt"));
  EXPECT_THAT(m, HasSubstr("checkpoint " + five + " is damaged: model.pt"));
}

TEST(Checkpoint, LayoutMismatchIsNotDamageAndDoesNotFallBack) {
  TempDir dir;
  TrainState job;
  job.save(dir.path + "/ck", 5);
  std::string ten = job.save(dir.path + "/ck", 10);
  TrainState other;
  pt::CheckpointMeta expect = job.meta;
  expect.workers = 2;
  try {
    pt::resumeFromNewest(dir.path + "/ck", expect, *other.net.module, other.optimizer);
    ADD_FAILURE() << "a checkpoint of another job layout was resumed";
  } catch (const pt::CheckpointDamaged& e) {
    ADD_FAILURE() << "a layout mismatch was taken for damage: " << e.what();
  } catch (const InvalidArgument& e) {
    // In the API's words (the CheckpointMeta field); poseidon train's refusal names its flag (BadInput).
    EXPECT_EQ(std::string(e.what()), "checkpoint " + ten +
                                         " was written with workers 1, this run has 2; resume with the same "
                                         "settings or use another checkpoint directory");
  }
}

// A checkpoint of another architecture with the same model name (a widened layer): refused naming the
// tensor, the module untouched. LibTorch's Module::load resized the parameters to the checkpoint's and
// the job trained the old architecture.
TEST(Checkpoint, AnotherArchitectureIsRefusedNamingTheTensor) {
  TempDir dir;
  TrainState job;
  const std::string five = job.save(dir.path + "/ck", 5);
  TrainState other;
  const auto first = other.net.module->named_parameters().pairs().front();
  {
    torch::NoGradGuard noGrad;
    auto shape = first.second.sizes().vec();
    shape[0] += 1;
    first.second.set_(torch::zeros(shape));
  }
  const auto before = other.params();
  const std::string said =
      messageOf([&] { pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer); });
  std::ostringstream ours, theirs;
  ours << first.second.sizes();
  theirs << job.net.module->named_parameters()[first.first].sizes();
  EXPECT_EQ(said, "checkpoint " + five + " holds " + first.first + " as Float " + theirs.str() +
                      ", this model's is Float " + ours.str() + ": it was written from another architecture");
  EXPECT_TRUE(testing::sameTensors(other.params(), before));
}

// A module with a child Module::save skips (torch::nn::Functional) loads as before: the check passes
// what the archive never held.
TEST(Checkpoint, AModuleWithAFunctionalChildLoads) {
  TempDir dir;
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Functional(torch::relu), torch::nn::Linear(3, 2));
  };
  auto a = make(), b = make();
  torch::optim::SGD oa(a->parameters(), torch::optim::SGDOptions(0.1)), ob(b->parameters(), torch::optim::SGDOptions(0.1));
  pt::CheckpointMeta meta;
  meta.model = "seq";
  meta.iteration = 3;
  const std::string path = pt::saveCheckpoint(dir.path + "/ck", meta, *a, oa);
  pt::loadCheckpoint(path, meta, *b, ob);
  for (size_t i = 0; i < a->parameters().size(); ++i) EXPECT_TRUE(torch::equal(a->parameters()[i], b->parameters()[i]));
}

// keep = 0 deleted every checkpoint, the new one too; one checkpoint given for their directory, or a
// file, resumed nothing and trained from 0 without a word; loadCheckpoint of a typo said "damaged".
TEST(Checkpoint, PathsAndCountsThatLoseWorkAreRefused) {
  TempDir dir;
  TrainState job;
  EXPECT_EQ(messageOf([&] { pt::saveCheckpoint(dir.path + "/ck", job.meta, *job.net.module, job.optimizer, 0); }),
            "saveCheckpoint: keep must be at least 1 (the newest), got 0");
  const std::string five = job.save(dir.path + "/ck", 5);
  TrainState other;
  EXPECT_EQ(messageOf([&] { pt::resumeFromNewest(five, job.meta, *other.net.module, other.optimizer); }),
            "checkpoint directory " + five + " is one checkpoint (it holds meta.json): give the directory that holds "
            "the step-N checkpoints, its parent, or load this one with loadCheckpoint");
  EXPECT_EQ(messageOf([&] { pt::resumeFromNewest(five + "/meta.json", job.meta, *other.net.module, other.optimizer); }),
            "checkpoint directory " + five + "/meta.json is a file");
  EXPECT_EQ(messageOf([&] { pt::loadCheckpoint(dir.path + "/ck/step-000000006", job.meta, *other.net.module,
                                               other.optimizer); }),
            "checkpoint " + dir.path + "/ck/step-000000006 does not exist");
  EXPECT_EQ(pt::resumeFromNewest(dir.path + "/none", job.meta, *other.net.module, other.optimizer).path, "");
}

// A checkpoint resumed after the DistributedModel was built (as poseidon train does): the parameters
// keep their storage, so a world of one still sees their gradients (it said "step() after forward()
// without loss.backward()": Module::load had swapped the storage under the wrapper's hooks).
TEST(Checkpoint, ResumingAfterWrappingTrains) {
  TempDir dir;
  TrainState job;
  job.save(dir.path + "/ck", 5);
  TrainState other;
  pt::DistributedOptions o;
  o.node.masterPort = freePort("127.0.0.1");
  o.node.settings.batch = 4;
  pt::DistributedModel dist(other.net.module, "lenet", o);
  pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer);
  EXPECT_TRUE(testing::sameTensors(other.params(), job.params()));
  torch::Tensor x = torch::randn({4, 1, 28, 28}), y = torch::randint(0, 10, {4}, torch::kLong);
  torch::nll_loss(torch::log_softmax(dist.forwardWith([&] { return other.net.forward(x); }), 1), y).backward();
  dist.step(other.optimizer);
  EXPECT_FALSE(testing::sameTensors(other.params(), job.params()));
  dist.finish();
}

// A checkpoint of the Python API (poseidon.save_checkpoint: its files checked, its meta not, a Python
// module's state) is another format, not damage: refused at once, without advice to remove it.
TEST(Checkpoint, APythonApiCheckpointIsNamedNotCalledDamaged) {
  TempDir dir;
  TrainState job;
  std::string five = job.save(dir.path + "/ck", 5);
  nlohmann::json meta = testing::readJson(five + "/meta.json");
  nlohmann::json python{{"iteration", 5}, {"world_size", 1}, {"files", meta["files"]}};
  std::ofstream(five + "/meta.json") << python.dump(2) << "\n";
  TrainState other;
  try {
    pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer);
    ADD_FAILURE() << "a Python API checkpoint was resumed";
  } catch (const pt::CheckpointDamaged& e) {
    ADD_FAILURE() << "a Python API checkpoint was taken for damage: " << e.what();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "checkpoint " + five +
                                         " was written by poseidon's Python API (poseidon.save_checkpoint); the C++ "
                                         "API (checkpoint.h) resumes only its own: use another checkpoint directory");
  }
}

// Checkpoints written before checksums: accepted, with a warning that says so.
TEST(Checkpoint, OlderCheckpointWithoutChecksumsLoadsWithAWarning) {
  TempDir dir;
  TrainState job;
  // A checkpoint as poseidon wrote them before checksums: meta.json without "files" and "meta_crc32".
  auto unverified = [&](int64_t iteration) {
    const std::string path = job.save(dir.path + "/ck", iteration);
    std::ofstream(path + "/meta.json") << job.meta.toJson().dump(2) << "\n";
    return path;
  };
  const std::string five = unverified(5);
  auto expected = job.params();
  TrainState other;
  auto r = pt::resumeFromNewest(dir.path + "/ck", job.meta, *other.net.module, other.optimizer);
  EXPECT_EQ(r.path, five);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0], HasSubstr("checkpoint " + five + " has no checksums"));
  EXPECT_TRUE(testing::sameTensors(other.params(), expected));
  // A newer one of those, truncated, is damage as a checksummed one would be: skipped for the older one
  // (it failed the job with "cannot load checkpoint ...: failed finding central directory").
  job.step();
  const std::string ten = unverified(10);
  fs::resize_file(ten + "/model.pt", 1000);
  TrainState third;
  auto fallback = pt::resumeFromNewest(dir.path + "/ck", job.meta, *third.net.module, third.optimizer);
  EXPECT_EQ(fallback.path, five);
  ASSERT_GE(fallback.warnings.size(), 1u);
  EXPECT_THAT(fallback.warnings[0], HasSubstr("checkpoint " + ten + " is damaged: "));
  EXPECT_TRUE(testing::sameTensors(third.params(), expected));
}

uint64_t freeBytes(const std::string& path) {
  struct statvfs s;
  if (statvfs(path.c_str(), &s) != 0) return 0;
  return static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
}

// The sizes of one LeNet checkpoint's files, from a save to an ordinary directory.
struct Sizes {
  uint64_t model, optimizer;
};

Sizes checkpointSizes(TrainState& job, const std::string& scratch) {
  std::string p = job.save(scratch, 1);
  return {fs::file_size(p + "/model.pt"), fs::file_size(p + "/optimizer.pt")};
}

// Room for one checkpoint and a half: the first fits, the second runs out in
// one of its tensor files. The error names the checkpoint and the real errno;
// nothing of the failed checkpoint stays (its space is given back); the older
// one is what resume loads.
TEST(CheckpointDiskFull, TensorFileThatDoesNotFitLeavesTheOlderCheckpoint) {
  TempDir dir;
  TrainState job;
  Sizes s = checkpointSizes(job, dir.path + "/scratch");
  const uint64_t one = testing::pagesFor(s.model) + testing::pagesFor(s.optimizer) + 4096;
  testing::SmallDisk disk(dir.path + "/disk", one + one / 2);
  if (!disk.mounted()) GTEST_SKIP() << disk.skipReason();
  const std::string ck = disk.path() + "/ck";

  std::string five = job.save(ck, 5);
  auto atFive = job.params();
  job.step();
  const uint64_t freeBefore = freeBytes(disk.path());
  std::string m = messageOf([&] { job.save(ck, 10); });
  EXPECT_THAT(m, HasSubstr("cannot write checkpoint " + ck + "/step-000000010: "));
  EXPECT_THAT(m, HasSubstr(".pt: No space left on device"));
  EXPECT_THAT(m, Not(HasSubstr("\n")));
  EXPECT_THROW(job.save(ck, 10), IoError);
  EXPECT_EQ(entries(ck), std::set<std::string>{"step-000000005"});
  EXPECT_EQ(freeBytes(disk.path()), freeBefore) << "the failed checkpoint's space was not given back";
  EXPECT_EQ(pt::newestCheckpoint(ck), five);

  TrainState other;
  auto r = pt::resumeFromNewest(ck, job.meta, *other.net.module, other.optimizer);
  EXPECT_EQ(r.path, five);
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_TRUE(testing::sameTensors(other.params(), atFive));

  // With room again, the same save succeeds.
  ASSERT_TRUE(disk.resize(4 * one));
  EXPECT_EQ(job.save(ck, 10), ck + "/step-000000010");
}

// Exactly the pages of model.pt and optimizer.pt: both fit, meta.json (written
// last) does not. That used to leave a complete-looking checkpoint with an
// empty meta.json and exit 0.
TEST(CheckpointDiskFull, MetaJsonThatDoesNotFitLeavesNoCheckpoint) {
  TempDir dir;
  TrainState job;
  Sizes s = checkpointSizes(job, dir.path + "/scratch");
  testing::SmallDisk disk(dir.path + "/disk", testing::pagesFor(s.model) + testing::pagesFor(s.optimizer));
  if (!disk.mounted()) GTEST_SKIP() << disk.skipReason();
  const std::string ck = disk.path() + "/ck";
  std::string m = messageOf([&] { job.save(ck, 5); });
  EXPECT_EQ(m, "cannot write checkpoint " + ck + "/step-000000005: meta.json: No space left on device (the "
               "checkpoints already in " + ck + " are untouched)");
  EXPECT_TRUE(entries(ck).empty());
  EXPECT_EQ(pt::newestCheckpoint(ck), "");
}

}  // namespace
}  // namespace poseidon
