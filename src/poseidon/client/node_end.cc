// How a node's part in the job ends (node.h): finish(), with the peers (the final barrier, then
// byes, so nobody takes the silence that follows for a failure), or leave(), without them: ~Node, or
// the exit handler for a node its program never destroyed (exit() mid-training, a leaked node). An
// unfinished rank that leaves tells its peers why, so they stop at once instead of declaring it lost
// after the timeout. Lifecycle's start, failure and the receive loop are node.cc.
#include <algorithm>
#include <exception>
#include <thread>

#include "poseidon/client/node.h"
#include "poseidon/common/at_exit.h"
#include "poseidon/common/error.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

Node::~Node() {
  withdrawLeaveAtExit(this);  // waits for the exit handler if it is running this node's leave
  leave(/*atExit=*/false);    // in full, even after the exit handler's, which spared the pool and syncers
}

void Node::leave(bool atExit) {
  // A rank that goes without finish() (its program ended, threw or exited) tells its peers, once, so
  // they stop now with that reason instead of declaring it lost after the timeout. A world of one has
  // no peer to tell, and its error line would only be noise after a clean exit.
  if (!left_.exchange(true) && loop_.joinable() && !finished_ && !error_.failed() && book_.worldSize() > 1) {
    // Unwinding an exception (the program's own, which it reports next): the peers learn why this rank
    // left, and this rank prints nothing that would read as the cause ahead of the real one.
    const bool unwinding = !atExit && std::uncaught_exceptions() > 0;
    const char* how = atExit      ? "its program exited"
                      : unwinding ? "its program threw an error"
                                  : "its program ended or threw an error";
    fail(std::make_exception_ptr(AbortedError(strCat("rank ", rank(), " left the job before finish() (", how, ")"))),
         /*tellPeers=*/true, /*log=*/!unwinding);
  }
  if (atExit) {
    closeAtExit();
    return;
  }
  // Queued sends and reconstructions must not touch the caller's buffers any more.
  for (auto& s : syncers_) s->close();
  if (local_) local_->close();
  dropHeldRebuilds();  // after the close: the receive loop may still hold one more until then
  stopReceiveLoop();
  sumLanes_.clear();  // sums what the loop handed them and sends the results while the van is still open
  pool_.reset();      // drains queued sends while the van is still open
  if (van_) van_->close();
  coordinator_.reset();
  releasePortClaim();
}

// Stops the receive loop and waits for it, unless this is the loop's own thread (exit() called from a
// callback on it, and the node destroyed there afterwards): then the loop ends with the process.
void Node::stopReceiveLoop() {
  stopLoop_ = true;
  if (!loop_.joinable()) return;
  if (loop_.get_id() == std::this_thread::get_id()) loop_.detach();
  else loop_.join();
}

// exit() promises nothing about the program's other threads, and one may still be inside this node: a
// watchdog called exit() while the main thread waits on a barrier (the abort above wakes it), or a
// callback on the pool did. So unlike ~Node this leaves the pool, the syncers and the caller's buffers
// as they are: only the receive loop stops (unless this is it) and the van closes, whose sends refuse
// from then on. Closing the context then delivers the abort within the van's linger. A node in
// finish() on another thread is left to it: that thread closes the van after the loop.
void Node::closeAtExit() {
  if (inFinish_) return;
  stopReceiveLoop();
  if (van_) van_->close();
  coordinator_.reset();
  zap_.reset();  // the last socket on the context but the van's
  ctx_.close();
}

void Node::finish() {
  if (finished_) return;
  inFinish_ = true;
  throwIfFailed();
  int64_t finishedAt = -1;
  if (countsIterations()) {
    finishedAt = syncedThrough_.load();
    finishing_ = true;
    checkIterationCounts();
    throwIfFailed();
  }
  collectives_->barrier(/*throughOwnLoop=*/false, finishedAt);
  finished_ = true;
  // Say bye, so that peers still finishing do not take our silence for a failure.
  sendToPeers(wire::bye(iteration_.load()), {}, false);
  // Wait for the peers' byes, at most the van's linger (what closing would spend anyway): a peer
  // that said bye reads nothing more, so what is still queued to it is dropped at close instead of
  // lingered on. Otherwise the last rank out waits the whole linger on its byes to peers that
  // already closed (8 ranks in one process: 0.7 s more per job end).
  std::vector<bool> quiet;
  {
    std::unique_lock<std::mutex> lock(byeMutex_);
    byeCv_.wait_for(lock, std::chrono::milliseconds(std::max(0, options_.van.lingerMs)), [&] {
      return error_.failed() || std::count(saidBye_.begin(), saidBye_.end(), true) == book_.worldSize() - 1;
    });
    quiet = saidBye_;
  }
  stopReceiveLoop();
  sumLanes_.clear();
  dropHeldRebuilds();  // nothing can run them once the pool is gone
  pool_.reset();
  van_->close(quiet);
  coordinator_.reset();  // its port, and this process's claim on it, go back now, not at ~Node
  releasePortClaim();
}

}  // namespace poseidon
