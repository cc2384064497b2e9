// FcChannel: the model-parallel link of merged FC (Omnivore section V-A, Fig. 5a).
//
// With merged FC the fully-connected layers live on one FC server (rank 0,
// kFcServerRank); the conv layers stay data-parallel in compute groups. Each
// step a worker sends the FC server the output of its conv layers
// (fc-forward, type 56) and waits for the gradient of its loss with respect to
// that output (fc-backward, type 57) before its conv backward can run. The
// payloads are opaque here (the integration layer encodes the tensors and
// checks their sizes); this class is the two mailboxes:
//   FC server: requests in arrival order, taken by the FC server's own thread;
//   worker:    the reply to its one outstanding request, by round.
//
// Threads: deliver*() on the receive loop, or on the sender's own thread when
// the FC server's rank is itself a worker (a rank does not send to itself);
// nextRequest() on the FC server's thread; waitReply() on the user's thread;
// wake() from whoever records the job's failure. mutex_ is a leaf lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "poseidon/common/sticky_error.h"

namespace poseidon {

constexpr int kFcServerRank = 0;

class FcChannel {
 public:
  struct Request {
    int from = 0;       // the worker's rank
    int64_t round = 0;  // its iteration
    std::vector<uint8_t> payload;
  };
  // At most this many requests wait per worker, and this many per rank of the job in all (a worker
  // has one outstanding; more is a peer misbehaving).
  static constexpr size_t kMaxQueuedPerWorker = 2;

  FcChannel(const StickyError& error, int worldSize) : error_(error), maxQueued_(kMaxQueuedPerWorker * worldSize) {}

  // FC server side. ProtocolError when the queue is full (nothing is queued then).
  void deliverRequest(Request request);
  // Waits up to `wait` for the next request; false when none came (the server then checks whether
  // it should stop). Rethrows the job's error.
  bool nextRequest(Request* out, std::chrono::milliseconds wait);

  // Worker side. expectReply(round) before sending the request; a reply for any other round, or a
  // second one, is a ProtocolError and is dropped.
  void expectReply(int64_t round);
  void deliverReply(int64_t round, std::vector<uint8_t> payload);
  // The reply's payload. Rethrows the job's error; returns false after `timeout` without it.
  bool waitReply(std::vector<uint8_t>* out, std::chrono::milliseconds timeout);

  void wake();

 private:
  const StickyError& error_;
  const size_t maxQueued_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Request> requests_;  // guarded by mutex_
  int64_t expected_ = -1;         // the round whose reply the worker waits for (-1: none)
  bool replied_ = false;
  std::vector<uint8_t> reply_;
};

// The payloads (docs/wire.md). fc-forward: rows, cols (i64), lr (f32), 4 bytes (zero, ignored), the labels
// (rows i64), the conv output (rows x cols f32, row-major). fc-backward: rows, cols (i64), the loss
// (f64), the gradient w.r.t. the conv output (rows x cols f32). Decoding checks every size against
// the payload and throws ProtocolError naming what does not fit; the views point into the payload.
struct FcForwardView {
  float lr = 0;
  int64_t rows = 0, cols = 0;
  const float* activations = nullptr;
  const int64_t* labels = nullptr;
};
struct FcBackwardView {
  double loss = 0;
  int64_t rows = 0, cols = 0;
  const float* gradient = nullptr;
};
std::vector<uint8_t> encodeFcForward(float lr, int64_t rows, int64_t cols, const float* activations,
                                     const int64_t* labels);
FcForwardView decodeFcForward(const std::vector<uint8_t>& payload);
std::vector<uint8_t> encodeFcBackward(double loss, int64_t rows, int64_t cols, const float* gradient);
FcBackwardView decodeFcBackward(const std::vector<uint8_t>& payload);

}  // namespace poseidon
