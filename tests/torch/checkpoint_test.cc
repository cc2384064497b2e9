// Checkpoints in one process: a full disk (a small tmpfs) while saving.
#include "poseidon/torch/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <set>

#include "checkpoint_helpers.h"
#include "cli_helpers.h"
#include "poseidon/common/error.h"

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
  EXPECT_EQ(pt::loadCheckpoint(five, job.meta, *other.net.module, other.optimizer).iteration, 5);
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
