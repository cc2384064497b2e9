#include "poseidon/transport/scheduler.h"

#include <algorithm>
#include <limits>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/transport/fragments.h"
#include "poseidon/wire/message_table.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

namespace {
std::atomic<uint64_t> gWakeId{0};
}  // namespace

PriorityScheduler::Priority PriorityScheduler::priorityOf(const FrameHeader& header) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  switch (wire::messageInfo(header.type).sendClass) {
    case wire::SendClass::kRound:
      return {header.iteration, static_cast<int64_t>(header.layer)};
    // Compute-group messages keep one class (FIFO among themselves); Node does not schedule those jobs.
    case wire::SendClass::kGroup:
      return {kMax, kMax};
    case wire::SendClass::kControl:
      break;
  }
  return {kMin, 0};
}

PriorityScheduler::PriorityScheduler(zmq::context_t& ctx, std::vector<zmq::socket_t*> links, size_t windowBytes,
                                     size_t ranks)
    : links_(std::move(links)),
      windowBytes_(windowBytes),
      ranks_(ranks > 0 ? ranks : links_.size()),
      queues_(links_.size()),
      blocked_(links_.size(), false),
      wakeIn_(ctx, zmq::socket_type::pair),
      wakeOut_(ctx, zmq::socket_type::pair) {
  const std::string wake = "inproc://poseidon-wake-" + std::to_string(gWakeId.fetch_add(1));
  wakeIn_.set(zmq::sockopt::linger, 0);
  wakeOut_.set(zmq::sockopt::linger, 0);
  wakeIn_.bind(wake);
  wakeOut_.connect(wake);
  sender_ = std::thread([this] { senderLoop(); });
}

PriorityScheduler::~PriorityScheduler() { stop(std::chrono::steady_clock::now()); }

void PriorityScheduler::wakeLocked() {
  // Wakes the sender's poll (a full wake pipe means it is awake already).
  wakeOut_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);
}

void PriorityScheduler::stop(std::chrono::steady_clock::time_point stopBy) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      stopBy_ = stopBy;
      wakeLocked();
    }
  }
  if (sender_.joinable()) {
    sender_.join();
    wakeOut_.close();
    wakeIn_.close();
  }
}

void PriorityScheduler::enqueue(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body) {
  // Whole, or in fragments of the window's size (each: the header, its slice, and where it goes).
  const size_t total = body.size(), chunk = windowBytes_;
  const size_t pieces = total <= chunk ? 1 : (total + chunk - 1) / chunk;
  const Priority priority = priorityOf(header);
  const uint64_t id = pieces > 1 ? nextFragmentId_.fetch_add(1) : 0;
  std::vector<std::unique_ptr<Queued>> qs;
  for (size_t i = 0; i < pieces; ++i) {
    auto q = std::make_unique<Queued>();
    q->priority = priority;
    q->header = header;
    if (pieces == 1) {
      q->head = std::move(head);
      q->body = std::move(body);
    } else {
      const size_t off = i * chunk, len = std::min(chunk, total - off);
      q->head = zmq::message_t(head.data(), head.size());
      q->body = zmq::message_t(static_cast<const uint8_t*>(body.data()) + off, len);
      q->fragment = encodeFragmentWhere(id, off);
    }
    qs.push_back(std::move(q));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw IoError("transport closed");
  if (!sendError_.empty()) throw IoError(sendError_);
  auto& heap = queues_[static_cast<size_t>(dest)];
  for (auto& q : qs) {
    q->seq = nextSeq_++;
    heap.push_back(std::move(q));
    std::push_heap(heap.begin(), heap.end(), Later());
    ++queued_;
  }
  wakeLocked();
}

size_t PriorityScheduler::queued() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_;
}

bool PriorityScheduler::waitQueuedAtMost(size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return handedOver_.wait_for(lock, timeout, [&] { return queued_ <= n; });
}

void PriorityScheduler::hold(bool hold, size_t letThrough) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_ = hold;
  letThrough_ = letThrough;
  if (!stopping_) wakeLocked();
}

void PriorityScheduler::pumpLocked() {
  const Later later;
  for (;;) {
    if (held_ && !stopping_ && letThrough_ == 0) {
      handedOver_.notify_all();  // waitQueuedAtMost
      return;
    }
    int best = -1;
    for (size_t d = 0; d < queues_.size(); ++d) {
      if (blocked_[d] || queues_[d].empty()) continue;
      if (best < 0 || later(queues_[best].front(), queues_[d].front())) best = static_cast<int>(d);
    }
    if (best < 0) {
      handedOver_.notify_all();  // waitQueuedAtMost
      return;
    }
    auto& q = queues_[static_cast<size_t>(best)];
    Queued& m = *q.front();
    zmq::socket_t& socket = *links_[static_cast<size_t>(best)];
    try {
      if (!socket.send(m.head, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        blocked_[static_cast<size_t>(best)] = true;  // its pipe is full: wait for POLLOUT
        continue;
      }
      // The high-water mark counts whole messages: a started one's other parts are always taken.
      if (m.fragment.size() != 0) {
        socket.send(m.body, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        socket.send(m.fragment, zmq::send_flags::dontwait);
      } else {
        socket.send(m.body, zmq::send_flags::dontwait);
      }
    } catch (const zmq::error_t& e) {
      if (sendError_.empty()) {
        const size_t link = static_cast<size_t>(best);
        sendError_ = strCat("send of ", msgTypeName(m.header.type), " to rank ", link % ranks_,
                            link >= ranks_ ? " (urgent connection)" : "", " failed: ", e.what());
      }
      POSEIDON_LOG(kError) << sendError_;
    }
    std::pop_heap(q.begin(), q.end(), later);
    q.pop_back();
    --queued_;
    if (held_ && letThrough_ > 0) --letThrough_;
  }
}

void PriorityScheduler::senderLoop() {
  try {
    senderLoopBody();
  } catch (const std::exception& e) {
    // Nothing may escape the thread: record the failure (every later send() throws it) and drop
    // what is queued, so that no caller waits on it.
    std::lock_guard<std::mutex> lock(mutex_);
    if (sendError_.empty()) sendError_ = strCat("send scheduler failed: ", e.what());
    POSEIDON_LOG(kError) << sendError_;
    for (auto& q : queues_) q.clear();
    queued_ = 0;
  }
}

void PriorityScheduler::senderLoopBody() {
  std::vector<zmq::pollitem_t> items;
  std::vector<size_t> waiting;
  for (;;) {
    items.assign(1, zmq::pollitem_t{wakeIn_.handle(), 0, ZMQ_POLLIN, 0});
    waiting.clear();
    std::chrono::milliseconds timeout{-1};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pumpLocked();
      if (stopping_) {
        const auto now = std::chrono::steady_clock::now();
        if (queued_ == 0 || now >= stopBy_) {
          if (queued_ != 0) {
            POSEIDON_LOG(kWarning) << queued_ << " queued messages not sent before the transport closed";
          }
          return;
        }
        timeout = std::chrono::duration_cast<std::chrono::milliseconds>(stopBy_ - now) + std::chrono::milliseconds(1);
      }
      for (size_t d = 0; d < queues_.size(); ++d) {
        if (!blocked_[d] || queues_[d].empty()) continue;
        items.push_back(zmq::pollitem_t{links_[d]->handle(), 0, ZMQ_POLLOUT, 0});
        waiting.push_back(d);
      }
    }
    try {
      zmq::poll(items.data(), items.size(), timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw IoError(strCat("poll failed: ", e.what()));
    }
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t drop;
      while (wakeIn_.recv(drop, zmq::recv_flags::dontwait)) {
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 1; i < items.size(); ++i)
      if (items[i].revents & ZMQ_POLLOUT) blocked_[waiting[i - 1]] = false;
  }
}
}  // namespace poseidon
