// Exact checkpoints of a training job (docs/reliability.md).
//
// DIR/step-000000120/{model.pt, optimizer.pt, meta.json} holds the whole job
// state after 120 iterations: parameters, optimizer state (momentum buffers)
// and where the data order stands (the iteration; the per-epoch order is a
// function of seed and epoch, so iteration + seed fix it). Nothing else
// carries state across iterations: the KV store's rounds are complete at
// every BSP barrier, and training draws no random numbers after
// initialization.
//
// Durability: a checkpoint is written into step-...tmp with plain POSIX
// writes (every error seen with its errno, a full disk included), every file
// and the directory fsync'd and closed, then renamed; a half-written one is
// never picked, and a failed one is removed again.
//
// Integrity: meta.json holds the size and CRC-32 of model.pt and
// optimizer.pt and a CRC-32 of its own content. Resume verifies them and
// falls back from a damaged checkpoint to the newest intact one.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon::pt {

struct CheckpointMeta {
  std::string model;
  int64_t iteration = 0;  // iterations completed
  int workers = 0;
  int64_t batch = 0;
  uint64_t seed = 0;
  int64_t trainLimit = -1;
  // Compute-group mode: the number of groups (layout: a resume must use the same), and the
  // shards' version clock when it was taken (their momentum is optimizer.pt's, their
  // parameters model.pt's; every group's clock is `iteration`).
  int groups = 0;
  int64_t groupVersion = 0;
  // This run only (not saved): a group-mode checkpoint may be resumed with another number of
  // groups (`poseidon train --regroup`: Omnivore's optimizer changes g between its epochs).
  bool regroup = false;
  // This run only (not saved): refusals name poseidon train's flags (--workers, "use another
  // --checkpoint DIR") rather than the layout's fields (workers, "use another checkpoint directory"),
  // which is what a program calling this API has to change.
  bool namedAsFlags = false;
  // The job layout only (what resume compares); meta.json adds the checksums.
  nlohmann::json toJson() const;
};

// A checkpoint whose files do not match the checksums in its meta.json, or
// whose meta.json is unreadable. The message names the checkpoint and the file.
class CheckpointDamaged : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// The newest complete checkpoint in dir (one with a meta.json), or "" (dir
// missing or empty). Complete is not verified: see resumeFromNewest.
std::string newestCheckpoint(const std::string& dir);

// Saves atomically; keeps the newest `keep` (>= 1, else InvalidArgument) checkpoints. Throws IoError
// "cannot write checkpoint DIR/step-N: FILE: <strerror>" (for a full disk:
// "No space left on device"); the checkpoints already in dir are untouched.
std::string saveCheckpoint(const std::string& dir, const CheckpointMeta& meta, torch::nn::Module& module,
                           torch::optim::Optimizer& optimizer, int keep = 2);

// Loads into module and optimizer after checking that the files match their
// checksums (CheckpointDamaged otherwise, before anything is loaded) and that
// the checkpoint belongs to a job like `expect` (model, workers, batch, seed,
// train limit): resuming with another data order would not be exact. Throws
// InvalidArgument naming the checkpoint and the mismatch, as is a parameter or
// buffer whose shape or type differs from the module's (another architecture).
// The tensors are copied into the module's own (its parameters keep their
// storage, so a DistributedModel may be built before or after). A checkpoint from
// before checksums were written is loaded unverified; `warnings` gets a line.
CheckpointMeta loadCheckpoint(const std::string& path, const CheckpointMeta& expect, torch::nn::Module& module,
                              torch::optim::Optimizer& optimizer, std::vector<std::string>* warnings = nullptr);

// The job layout of the newest checkpoint in dir whose meta.json is intact, checked against `expect`
// as loadCheckpoint checks it (InvalidArgument naming the mismatch), without loading its files: for a
// launcher, before each of its ranks finds the mismatch. No checkpoint in dir: nothing to check.
void checkCheckpointLayout(const std::string& dir, const CheckpointMeta& expect);

struct Resumed {
  std::string path;  // "" when dir holds no checkpoint
  CheckpointMeta meta;
  // One line per damaged newer checkpoint that was skipped, and for an
  // unverified (pre-checksum) one; the caller logs them.
  std::vector<std::string> warnings;
};

// Loads the newest intact checkpoint in dir. Damaged ones are skipped (each
// with a warning); if every checkpoint is damaged, throws InvalidArgument
// naming them rather than silently starting over. A job-layout mismatch is
// not damage and is thrown at once. dir missing: nothing to resume (a first
// run); dir a file, or one checkpoint rather than their directory: InvalidArgument.
Resumed resumeFromNewest(const std::string& dir, const CheckpointMeta& expect, torch::nn::Module& module,
                         torch::optim::Optimizer& optimizer);

}  // namespace poseidon::pt
