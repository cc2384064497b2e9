// Limits the core enforces, for the ranges of the CLI's flags: a value the
// core would refuse later (the coordinator while reading the join messages,
// the KV layout, the transport) is refused at parse time instead, under the
// flag's own name.
#pragma once

#include <cstdint>

#include "poseidon/sfb/sufficient_factors.h"
#include "poseidon/wire/frame.h"

namespace poseidon::cli {

// Ranks in one job: the information book holds at most 1 << 16 nodes
// (kMaxNodes in coordinator/book.cc).
constexpr int64_t kMaxRanks = int64_t{1} << 16;
// The per-worker batch K is the row count of every SFB factor, which peers
// accept up to kMaxFactorRows.
constexpr int64_t kMaxBatch = kMaxFactorRows;
// A KV pair holds at least one float (KvLayout, the book's readSettings) and
// travels as one frame payload.
constexpr int64_t kMinPairBytes = 4;
constexpr int64_t kMaxPairBytes = static_cast<int64_t>(kDefaultMaxPayloadBytes);
// Straggler dropping: D < P1 (the book), so at most kMaxRanks - 1.
constexpr int64_t kMaxDropStragglers = kMaxRanks - 1;
// Threads a worker starts for one flag (--threads, --sync-threads): past a
// few thousand, std::thread's creation fails (100000 syncer threads aborted
// with a backtrace; 100000 LibTorch threads ran for minutes without a step).
// 1024 is far above any core count this runs on; Node::start refuses more
// syncer threads too (client/node.cc), for Python and C++ users.
constexpr int64_t kMaxThreadsPerWorker = 1024;
// A modeled step (--pad-ms, --pad-jitter-ms, POSEIDON_SLOW's MS): at most an hour. Past ~1e16 ms the
// wait's conversion to a clock duration overflows and the step was not padded at all, while the
// run reported it padded and exited 0.
constexpr double kMaxPadMs = 3600e3;

// The planner's discrete-event models (plan --predict, --sweep, --check): past a few thousand
// workers a row takes minutes and its memory grows with the pairs' P^2 messages.
constexpr int kMaxPlannedWorkers = 4096;

}  // namespace poseidon::cli
